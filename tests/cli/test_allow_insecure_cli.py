"""`specsteer generate --allow-insecure`, run as users run it (a child process): a device token
over plain ws:// to another host is refused without the flag and sent, with a warning, with it.

The companion is a child `specsteer-companion serve` with a token store, listening on this
machine's network address (not loopback), so the token really crosses an interface in the clear
and the generation only succeeds if the companion received and accepted it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from helpers.ci import skip_or_fail

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.auth import TokenStore
from specsteer_companion.process import start_companion

pytestmark = pytest.mark.slow  # CLI processes: not in ./dev test --fast

G = str(tiny_model_dir("llama", seed=1))
S = str(tiny_model_dir("llama", seed=0))
REFUSED = "refusing to send the device token over unencrypted ws://"
WARNED = "sending the device token over unencrypted ws://"


def _network_address() -> str:
    """An IPv4 address of this machine that is not loopback (the route's source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 9))  # UDP: picks a route, sends nothing
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        skip_or_fail("this machine has no non-loopback IPv4 address")
    return address


@pytest.fixture(scope="module")
def remote_companion(tmp_path_factory):
    """(ws:// URL on the network address, a live device token)."""
    address = _network_address()
    store = tmp_path_factory.mktemp("tokens") / "tokens.db"
    token = TokenStore(store).create("lan-device").secret
    proc, url = start_companion(G, S, timeout_s=120, open_access=False,
                                args=["--tokens", str(store), "--host", "0.0.0.0"])
    try:
        yield url.replace("0.0.0.0", address), token
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _generate(url: str, token: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specsteer", "generate", "Budget for the next quarter",
         "--specialist", S, "--companion", url, "--token", token, "--max-new-tokens", "8",
         "--json", *flags],
        capture_output=True, text=True, timeout=120)


def test_generate_refuses_a_token_over_ws_to_another_host(remote_companion):
    url, token = remote_companion
    done = _generate(url, token)
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert REFUSED in said and "--allow-insecure" in said and WARNED not in said


def test_generate_allow_insecure_sends_it_with_a_warning(remote_companion):
    url, token = remote_companion
    done = _generate(url, token, "--allow-insecure")
    assert done.returncode == 0, done.stdout + done.stderr
    assert WARNED in done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert not stats["degraded"] and stats["rounds"] > 0  # the companion accepted the token
