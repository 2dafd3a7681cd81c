"""`tokens` and `cert` commands, run through a Typer app built here as the real CLI will."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from specsteer_companion.auth import TokenStore
from specsteer_companion.cli_tokens import HOME_ENV, cert_app, default_store_path, tokens_app

app = typer.Typer()
app.add_typer(tokens_app, name="tokens")
app.add_typer(cert_app, name="cert")
runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


def _ok(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_default_store_path_follows_the_environment(home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_store_path() == home / "tokens.db"
    monkeypatch.delenv(HOME_ENV)
    assert default_store_path() == (
        Path("~/.local/share/specsteer-companion").expanduser() / "tokens.db")


def test_create_prints_a_working_secret_once_with_a_warning(home: Path) -> None:
    result = _ok("tokens", "create", "alice-phone")
    secret = result.stdout.strip()
    assert secret.startswith("sst_") and "\n" not in secret  # stdout is the secret alone
    assert "cannot be shown again" in result.stderr
    info = TokenStore(home / "tokens.db").verify(secret)
    assert info is not None and info.device_name == "alice-phone"
    assert secret.encode() not in (home / "tokens.db").read_bytes()


def test_list_shows_tokens_but_no_secret(home: Path) -> None:
    secret = _ok("tokens", "create", "alice-phone").stdout.strip()
    token_id = secret.split("_")[1]
    table = _ok("tokens", "list")
    assert token_id in table.output and "alice-phone" in table.output
    assert secret not in table.output and secret.split("_", 2)[2] not in table.output
    listed = json.loads(_ok("tokens", "list", "--json").stdout)
    assert [row["token_id"] for row in listed] == [token_id]
    assert listed[0]["revoked_at"] is None
    assert secret not in json.dumps(listed)


def test_revoke_by_id_and_by_name(home: Path) -> None:
    first = _ok("tokens", "create", "alice-phone").stdout.strip()
    second = _ok("tokens", "create", "alice-phone").stdout.strip()
    _ok("tokens", "revoke", first.split("_")[1])
    store = TokenStore(home / "tokens.db")
    assert store.verify(first) is None and store.verify(second) is not None
    _ok("tokens", "revoke", "alice-phone")
    assert store.verify(second) is None
    listed = json.loads(_ok("tokens", "list", "--json").stdout)
    assert all(row["revoked_at"] is not None for row in listed)


def test_revoking_nothing_fails_with_a_message(home: Path) -> None:
    result = runner.invoke(app, ["tokens", "revoke", "nobody"])
    assert result.exit_code == 1
    assert "no live token" in result.stderr


def test_bad_device_name_fails_without_traceback(home: Path) -> None:
    result = runner.invoke(app, ["tokens", "create", "has space"])
    assert result.exit_code == 1
    assert "invalid device name" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_store_option_overrides_the_default(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "t.db"
    secret = _ok("tokens", "create", "bob-laptop", "--store", str(other)).stdout.strip()
    assert TokenStore(other).verify(secret) is not None
    assert not (home / "tokens.db").exists()
    assert "bob-laptop" in _ok("tokens", "list", "--store", str(other)).output


def test_list_on_a_damaged_store_fails_cleanly(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 200)
    result = runner.invoke(app, ["tokens", "list", "--store", str(bad)])
    assert result.exit_code == 1
    assert "damaged" in result.stderr


def test_cert_make_self_signed_writes_a_usable_pair(tmp_path: Path) -> None:
    result = _ok("cert", "make-self-signed", str(tmp_path / "tls"), "--hostname", "companion.lan")
    cert = tmp_path / "tls" / "companion-cert.pem"
    key = tmp_path / "tls" / "companion-key.pem"
    assert str(cert) in result.stdout and str(key) in result.stdout
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)  # raises if the pair does not match
    again = runner.invoke(app, ["cert", "make-self-signed", str(tmp_path / "tls")])
    assert again.exit_code == 1 and "already exists" in again.stderr
