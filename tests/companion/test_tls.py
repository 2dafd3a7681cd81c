"""TLS contexts over a real loopback handshake with a freshly made self-signed certificate."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

from specsteer.errors import CompanionConfigError, TLSFileError
from specsteer_companion.tls import client_ssl_context, make_self_signed, server_ssl_context


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_self_signed(tmp_path_factory.mktemp("tls"))


class EchoServer:
    """One-connection TLS echo server on 127.0.0.1; records the server-side outcome."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.context = context
        self.error: BaseException | None = None
        self.version: str | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            raw, _ = self.listener.accept()
            raw.settimeout(10)
            with self.context.wrap_socket(raw, server_side=True) as tls:
                self.version = tls.version()
                tls.sendall(tls.recv(1024).upper())
        except (OSError, ssl.SSLError) as exc:
            self.error = exc
        finally:
            self.listener.close()

    def join(self) -> None:
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


def _talk(port: int, context: ssl.SSLContext, server_hostname: str) -> tuple[bytes, str | None]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=server_hostname) as tls:
        tls.sendall(b"hello companion")
        return tls.recv(1024), tls.version()


def test_handshake_succeeds_with_the_self_signed_cert_as_ca(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    reply, version = _talk(server.port, client_ssl_context(cafile=cert), "localhost")
    server.join()
    assert server.error is None
    assert reply == b"HELLO COMPANION"
    assert version in {"TLSv1.2", "TLSv1.3"} and server.version == version


def test_localhost_cert_also_covers_the_loopback_ip(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    reply, _ = _talk(server.port, client_ssl_context(cafile=cert), "127.0.0.1")
    server.join()
    assert reply == b"HELLO COMPANION"


def test_client_without_the_ca_fails_verification(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    with pytest.raises(ssl.SSLCertVerificationError):
        _talk(server.port, client_ssl_context(), "localhost")  # system CAs only
    server.join()
    assert server.error is not None  # the server saw the handshake aborted


def test_client_refuses_a_cert_for_another_hostname(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    with pytest.raises(ssl.SSLCertVerificationError, match="[Hh]ostname|match"):
        _talk(server.port, client_ssl_context(cafile=cert), "companion.example.org")
    server.join()


def test_client_refuses_a_different_self_signed_cert(cert_pair: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    other_cert, _ = make_self_signed(tmp_path)
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    with pytest.raises(ssl.SSLCertVerificationError):
        _talk(server.port, client_ssl_context(cafile=other_cert), "localhost")
    server.join()


def test_insecure_client_connects_without_the_ca(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    server = EchoServer(server_ssl_context(cert, key))
    reply, _ = _talk(server.port, client_ssl_context(insecure=True), "localhost")
    server.join()
    assert reply == b"HELLO COMPANION"


def test_contexts_require_tls_1_2_or_newer(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    for context in (server_ssl_context(cert, key), client_ssl_context(cafile=cert)):
        assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    client = client_ssl_context(cafile=cert)
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname


def test_self_signed_files_are_pem_and_the_key_is_private(cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    assert cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in key.read_text()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_make_self_signed_does_not_overwrite_unless_asked(tmp_path: Path) -> None:
    cert, key = make_self_signed(tmp_path)
    before = cert.read_bytes()
    with pytest.raises(TLSFileError, match="already exists"):
        make_self_signed(tmp_path)
    assert cert.read_bytes() == before
    make_self_signed(tmp_path, overwrite=True)
    assert cert.read_bytes() != before


def test_missing_cert_file_is_a_clear_error(tmp_path: Path, cert_pair: tuple[Path, Path]) -> None:
    _, key = cert_pair
    with pytest.raises(TLSFileError, match="does not exist"):
        server_ssl_context(tmp_path / "nope.pem", key)
    with pytest.raises(TLSFileError, match="does not exist"):
        client_ssl_context(cafile=tmp_path / "nope.pem")
    with pytest.raises(TLSFileError, match="not a file"):
        server_ssl_context(tmp_path, key)


def test_garbage_or_mismatched_files_are_clear_errors(tmp_path: Path,
                                                      cert_pair: tuple[Path, Path]) -> None:
    cert, key = cert_pair
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(TLSFileError, match="key must belong"):
        server_ssl_context(junk, key)
    with pytest.raises(TLSFileError, match="no usable PEM"):
        client_ssl_context(cafile=junk)
    _, other_key = make_self_signed(tmp_path / "other")
    with pytest.raises(TLSFileError, match="key must belong"):
        server_ssl_context(cert, other_key)


def test_cafile_and_insecure_together_are_refused(cert_pair: tuple[Path, Path]) -> None:
    with pytest.raises(CompanionConfigError):
        client_ssl_context(cafile=cert_pair[0], insecure=True)
