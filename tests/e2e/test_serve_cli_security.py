"""`specsteer-companion serve` as users run it: with a token store, with TLS, never silently open.

Every companion here is a child process on tiny models; nothing uses `--open` except the test
that checks its warning.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specsteer.client import Client
from specsteer.errors import CompanionConfigError, CompanionError
from specsteer.history import HistoryStore
from specsteer.models.tiny import tiny_model_dir
from specsteer.protocol import ErrorCode
from specsteer_companion.auth import TokenStore
from specsteer_companion.process import start_companion
from specsteer_companion.tls import client_ssl_context, make_self_signed

pytestmark = pytest.mark.slow  # companion processes: not in ./dev test --fast

G = str(tiny_model_dir("llama", seed=1))
S = str(tiny_model_dir("llama", seed=0))


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specsteer_companion.cli", "serve",
                           "--generalist", G, "--specialist", S, "--port", "0", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("given", ["--cert", "--key"])
def test_half_a_tls_setup_is_refused_not_served_in_the_clear(tmp_path, given):
    cert, key = make_self_signed(tmp_path / "tls")
    done = _serve(given, str(cert if given == "--cert" else key), "--open")
    assert done.returncode == 1
    missing = "--key" if given == "--cert" else "--cert"
    assert f"{given} needs {missing} too" in done.stderr
    assert "companion ready" not in done.stdout


def test_tokens_and_tls_through_the_cli(tiny_model, tmp_path):
    cert, key = make_self_signed(tmp_path / "tls")
    store_path = tmp_path / "tokens.db"
    device = TokenStore(store_path).create("alice-phone")
    startup: list[str] = []
    proc, url = start_companion(G, S, timeout_s=120, open_access=False, startup=startup,
                                args=["--tokens", str(store_path), "--cert", str(cert),
                                      "--key", str(key)])
    try:
        assert url.startswith("wss://")
        tls = client_ssl_context(cert)
        history = HistoryStore(memory=True)
        ok = Client(tiny_model, history=history, companion=url, token=device.secret,
                    ssl_context=tls)
        assert not ok.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded
        for bad in (None, device.secret[:-1] + ("A" if device.secret[-1] != "A" else "B")):
            refused = Client(tiny_model, history=history, companion=url, ssl_context=tls,
                             **({} if bad is None else {"token": bad}))
            with pytest.raises(CompanionError) as info:
                refused.generate("Team offsite", max_new_tokens=4, offline="fail")
            assert info.value.code == ErrorCode.AUTH_FAILED
        revoke = subprocess.run([sys.executable, "-m", "specsteer_companion.cli", "tokens",
                                 "revoke", "alice-phone", "--store", str(store_path)],
                                capture_output=True, text=True, timeout=60)
        assert revoke.returncode == 0, revoke.stderr
        with pytest.raises(CompanionError, match="revoked"):
            ok.generate("Team offsite", max_new_tokens=4, offline="fail")
        assert TokenStore(store_path).list()[0].last_used_at is not None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "--open" not in "".join(startup) + out  # no open-mode warning on a token store


def test_open_mode_logs_a_warning():
    startup: list[str] = []
    proc, _ = start_companion(G, S, timeout_s=120, startup=startup)
    proc.terminate()
    proc.communicate(timeout=30)
    warning = [line for line in startup if "--open: every client is accepted" in line]
    assert warning, "".join(startup)


def test_the_client_refuses_to_send_a_token_in_the_clear_to_another_host(tiny_model):
    with pytest.raises(CompanionConfigError, match="unencrypted ws://"):
        Client(tiny_model, companion="ws://companion.example.com:8765", token="sst_x")
    # allowed: TLS, loopback, no token, or an explicit opt-in
    Client(tiny_model, companion="wss://companion.example.com:8765", token="sst_x")
    Client(tiny_model, companion="ws://127.0.0.1:8765", token="sst_x")
    Client(tiny_model, companion="ws://localhost:8765", token="sst_x")
    Client(tiny_model, companion="ws://companion.example.com:8765")
    Client(tiny_model, companion="ws://10.0.0.5:8765", token="sst_x", allow_insecure=True)
