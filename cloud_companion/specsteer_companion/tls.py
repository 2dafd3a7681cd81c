"""TLS for the device-companion link: server and client `ssl.SSLContext`s, self-signed certs.

Owns the TLS settings (TLS 1.2 at least, certificate and hostname checks on by default) and the
turning of missing or bad certificate files into `TLSFileError`s that say what to fix.
`make_self_signed` is for tests and local development; a public companion uses a certificate
from a real CA. Must not open sockets or decide which clients may connect (that is `auth`).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from specsteer.errors import CompanionConfigError, TLSFileError

if TYPE_CHECKING:
    from cryptography import x509

log = logging.getLogger("specsteer_companion.tls")

# TLS 1.0/1.1 are deprecated (RFC 8996); 1.2 is the oldest every supported client still speaks.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# A year: long enough that a development setup does not expire mid-project, short enough that a
# forgotten test key stops working.
SELF_SIGNED_DAYS = 365
CERT_FILENAME = "companion-cert.pem"
KEY_FILENAME = "companion-key.pem"


def _readable(path: str | os.PathLike[str], what: str) -> Path:
    file = Path(path).expanduser()
    if not file.exists():
        raise TLSFileError(f"{what} {file} does not exist; give the path of a PEM file")
    if not file.is_file():
        raise TLSFileError(f"{what} {file} is not a file")
    try:
        with file.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise TLSFileError(f"cannot read {what} {file}: {exc.strerror or exc}") from exc
    return file


def server_ssl_context(certfile: str | os.PathLike[str],
                       keyfile: str | os.PathLike[str]) -> ssl.SSLContext:
    """A server context presenting `certfile` (PEM chain) with its private key `keyfile`."""
    cert = _readable(certfile, "certificate file")
    key = _readable(keyfile, "key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TLSFileError(
            f"cannot use certificate {cert} with key {key} ({exc.reason or exc}): both must be "
            "PEM, unencrypted, and the key must belong to the certificate"
        ) from exc
    return context


def client_ssl_context(cafile: str | os.PathLike[str] | None = None, *,
                       insecure: bool = False) -> ssl.SSLContext:
    """A device-side context: trusts `cafile` (or the system CAs when None) and checks hostnames.

    `insecure=True` turns every check off, for a local development companion only; it logs a
    warning because it lets anyone on the path impersonate the companion.
    """
    if insecure and cafile is not None:
        raise CompanionConfigError("give either cafile or insecure=True, not both")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED + check_hostname
    context.minimum_version = MINIMUM_VERSION
    # Python 3.13 turns this on by default; turning it on everywhere keeps behaviour the same.
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if insecure:
        log.warning("TLS certificate checks are OFF: anyone on the network path can pose as "
                    "the companion; use only for local development")
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cafile is not None:
        ca = _readable(cafile, "CA file")
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise TLSFileError(f"CA file {ca} holds no usable PEM certificate ({exc})") from exc
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return context


def make_self_signed(directory: str | os.PathLike[str], hostname: str = "localhost", *,
                     overwrite: bool = False) -> tuple[Path, Path]:
    """Write a self-signed certificate for `hostname` and its key (mode 0600) into `directory`.

    The certificate is also the CA file a client passes as `cafile`. "localhost" also covers
    127.0.0.1 and ::1. Refuses to replace existing files unless `overwrite`, since a replaced
    key breaks every device that trusted the old certificate.
    """
    try:  # imported here: serving with a real certificate must not need `cryptography`
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise CompanionConfigError(
            "making a self-signed certificate needs the 'cryptography' package: "
            "pip install cryptography"
        ) from exc

    folder = Path(directory).expanduser()
    cert_path, key_path = folder / CERT_FILENAME, folder / KEY_FILENAME
    if not overwrite:
        for existing in (cert_path, key_path):
            if existing.exists():
                raise TLSFileError(f"{existing} already exists; remove it or pass overwrite")
    names = _subject_alt_names(hostname)
    key = ec.generate_private_key(ec.SECP256R1())  # P-256: fast to make, accepted everywhere
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_encipherment=False,
                          content_commitment=False, data_encipherment=False,
                          key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_private(key_path, key_pem)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    except OSError as exc:
        raise TLSFileError(f"cannot write certificate files in {folder}: {exc}") from exc
    return cert_path, key_path


def _subject_alt_names(hostname: str) -> list[x509.GeneralName]:
    from cryptography import x509

    if not hostname or any(c.isspace() for c in hostname):
        raise CompanionConfigError(f"invalid hostname {hostname!r} for a certificate")
    try:
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(hostname))]
    except ValueError:
        names = [x509.DNSName(hostname)]
    if hostname == "localhost":
        names += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.IPAddress(ipaddress.ip_address("::1"))]
    return names


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to a file that is 0600 from its first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(data)
