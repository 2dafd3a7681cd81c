"""Mistakes waiting cannot fix fail loudly; what may come back follows the offline policy.

A companion URL that is not ws:// or wss://, a token that is None, empty or not a string: a
`ConfigError` naming the argument and its value when the `Client` is built. A token the
companion refuses, other models, another protocol version, a certificate that does not verify:
a typed `CompanionRefused` at the first generation in every offline mode, after one connection
(no retry, no local-only text). A companion that is not there: the policy decides (degrade,
fail, wait).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import OfflinePolicy, Params
from specsteer.errors import (
    CompanionAuthError,
    CompanionError,
    CompanionModelMismatch,
    CompanionRefused,
    CompanionTLSError,
    CompanionUnavailable,
    CompanionVersionMismatch,
    ConfigError,
    InvalidQuery,
)
from specsteer.history import HistoryStore
from specsteer.link import FrameChannel
from specsteer_companion.auth import TokenStore
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.tls import client_ssl_context, make_self_signed, server_ssl_context
from specsteer_companion.verifier import Verifier

MODES = ("degrade", "fail", "wait(2)")
SUBJECT = "Team offsite"


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    history.add(kind="email", title="Offsite", body="Dear team, the offsite is in May.")
    return history


def _closed_port() -> int:
    """A loopback port nothing listens on (a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(("companion", "named", "hint"), [
    ("127.0.0.1:18766", "companion='127.0.0.1:18766'", "'ws://127.0.0.1:18766'"),
    ("localhost:8765", "companion='localhost:8765'", "'ws://localhost:8765'"),
    ("http://127.0.0.1:8765", "companion='http://127.0.0.1:8765'", "'ws://127.0.0.1:8765'"),
    ("https://companion.example", "companion='https://companion.example'",
     "'wss://companion.example'"),
    ("ws://", "companion='ws://'", "ws://"),
    ("ws://127.0.0.1:port", "companion='ws://127.0.0.1:port'", "the port is not a number"),
    ("", "companion=''", "companion=None"),
    (["ws://127.0.0.1:1", "http://127.0.0.1:2"], "companion[1]='http://127.0.0.1:2'",
     "'ws://127.0.0.1:2'"),
    ([], "not []", "non-empty list"),
    (8765, "not 8765", "ws:// or wss://"),
    ([b"ws://127.0.0.1:1"], "companion[0] must be", "b'ws://127.0.0.1:1'"),
])
def test_a_companion_that_is_not_a_websocket_url_is_refused_at_once(tiny_model, companion,
                                                                     named, hint) -> None:
    with pytest.raises(ConfigError) as refused:
        Client(tiny_model, companion=companion)
    assert named in str(refused.value) and hint in str(refused.value), refused.value
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(("token", "says"), [
    (None, "token=None"),
    ("", "token='' is empty"),
    ("   ", "token='   ' is empty"),
    (b"sst_secret", "token must be a str, not bytes (length 10)"),
    (1234, "token must be a str, not int"),
])
def test_a_token_that_is_none_empty_or_not_a_string_is_refused(tiny_model, token, says) -> None:
    with pytest.raises(ConfigError, match="token") as refused:
        Client(tiny_model, companion="ws://127.0.0.1:8765", token=token)
    assert says in str(refused.value), refused.value
    assert "sst_secret" not in str(refused.value)  # a token's bytes are never repeated
    # without a companion no token is sent, so none is checked; omitted: an --open companion
    Client(tiny_model, token=token)
    Client(tiny_model, companion="ws://127.0.0.1:8765")


def test_client_arguments_are_checked_and_named(tiny_model) -> None:
    for name, value in (("timeout_s", 0), ("connect_timeout_s", -1.0),
                        ("timeout_s", float("nan")), ("retrieve_k", -1),
                        ("max_prompt_tokens", 0), ("offline", "sometimes"),
                        ("offline", "wait(-1)"), ("offline", None)):
        with pytest.raises(ConfigError, match=name) as refused:
            Client(tiny_model, **{name: value})
        assert repr(value) in str(refused.value), refused.value


def test_decoding_options_name_the_field_and_the_value(tiny_model) -> None:
    """max_new_tokens=0 is refused (as the bridge does) instead of returning nothing."""
    client = Client(tiny_model)
    for name, value, says in (("max_new_tokens", 0, "max_new_tokens must be in [1, 8192], not 0"),
                              ("max_new_tokens", -1, "max_new_tokens must be in [1, 8192], "
                                                     "not -1"),
                              ("top_k", 0, "top_k must be in [1, 65535], not 0"),
                              ("k", -2, "k must be in [1, 64], not -2"),
                              ("gamma", float("nan"), "gamma must be a number, not nan"),
                              ("no_repeat_ngram", 1, "no_repeat_ngram must be 0 (off) or at "
                                                     "least 2, not 1")):
        with pytest.raises(ValueError) as refused:
            client.generate(SUBJECT, **{name: value})
        assert says in str(refused.value), refused.value
        with pytest.raises(ValueError, match=name):
            Params(**{name: value})
    with pytest.raises(InvalidQuery, match=r"the email task's query must be a string or a dict, "
                                           r"not int \(5\)"):
        client.generate(5)  # type: ignore[arg-type]


def _counting_auth(tokens: TokenStore, calls: list[str]):
    def authenticate(secret: str) -> str | None:
        calls.append(secret)
        info = tokens.verify(secret)
        return info.token_id if info else None
    return authenticate


def test_a_refused_token_raises_at_once_in_every_offline_mode(tiny_model, tiny_generalist,
                                                              store, tmp_path) -> None:
    """Wrong, unknown, revoked or missing: `CompanionAuthError` after one hello, in every mode
    (`offline="fail"` used to give a plain CompanionError, "degrade" local-only text, and
    "wait(2)" retried for two seconds)."""
    tokens = TokenStore(tmp_path / "tokens.db")
    issued, revoked = tokens.create("alice-laptop"), tokens.create("bob-phone")
    tokens.revoke(revoked.token_id)
    calls: list[str] = []
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             authenticate=_counting_auth(tokens, calls))
    with server.running() as url:
        good = Client(tiny_model, history=store, companion=url, token=issued.secret)
        assert not good.generate(SUBJECT, max_new_tokens=4, offline="fail").stats.degraded
        wrong = issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")
        for token in (wrong, revoked.secret, "sst_0000000000000000_" + "x" * 43, None):
            for mode in MODES:
                as_default = Client(tiny_model, history=store, companion=url, offline=mode,
                                    **({} if token is None else {"token": token}))
                per_call = Client(tiny_model, history=store, companion=url,
                                  **({} if token is None else {"token": token}))
                for client, options in ((as_default, {}), (per_call, {"offline": mode})):
                    calls.clear()
                    with pytest.raises(CompanionAuthError) as refused:
                        client.generate(SUBJECT, max_new_tokens=8, **options)
                    assert refused.value.code == protocol.ErrorCode.AUTH_FAILED
                    assert "tokens create" in str(refused.value)  # what to do about it
                    assert len(calls) == 1, (mode, calls)  # no retry, no background probe
                    assert isinstance(refused.value, CompanionRefused | CompanionError)
                    assert not isinstance(refused.value, CompanionUnavailable)


class _Counted:
    """A channel factory that counts the connections it made."""

    def __init__(self, make: Callable[[], FrameChannel]) -> None:
        self.make, self.calls = make, 0

    def __call__(self) -> FrameChannel:
        self.calls += 1
        return self.make()


def test_other_models_raise_at_once_in_every_offline_mode(tiny_model, tiny_generalist,
                                                          store) -> None:
    """The companion's generic Specialist is not the device's artifact: no retry fixes it."""
    wrong = Verifier(tiny_generalist, tiny_generalist)
    for mode in MODES:
        connect = _Counted(lambda: LocalChannel.for_verifier(wrong))
        client = Client(tiny_model, history=store, companion=connect, offline=mode)
        with pytest.raises(CompanionModelMismatch, match="same artifact"):
            client.generate(SUBJECT, max_new_tokens=8)
        assert connect.calls == 1, mode
    # the device expects another Generalist than the companion serves
    expects = Client(tiny_model, history=store, generalist_sha256="0" * 64,
                     companion=lambda: LocalChannel.for_verifier(
                         Verifier(tiny_generalist, tiny_model)))
    with pytest.raises(CompanionModelMismatch, match="serves Generalist .*, not 000000000000"):
        expects.generate(SUBJECT, max_new_tokens=8)


_NEXT = bytes([protocol.PROTOCOL_VERSION + 1])


class _OtherVersion:
    """A link to an in-process companion where one side speaks the next protocol version."""

    def __init__(self, inner: LocalChannel, side: str) -> None:
        self.inner, self.side = inner, side

    def send(self, frame: bytes) -> None:
        self.inner.send(_NEXT + frame[1:] if self.side == "device" else frame)

    def recv(self, timeout: float) -> bytes:
        frame = self.inner.recv(timeout)
        return _NEXT + frame[1:] if self.side == "companion" else frame

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("side", ["companion", "device"])
def test_another_protocol_version_raises_at_once_in_every_offline_mode(
        tiny_model, tiny_generalist, store, side) -> None:
    """A companion of another version (its answer) or one refusing this device's version
    (its Error frame): `CompanionVersionMismatch`, never local-only text."""
    verifier = Verifier(tiny_generalist, tiny_model)
    for mode in MODES:
        connect = _Counted(lambda: _OtherVersion(LocalChannel.for_verifier(verifier), side))
        client = Client(tiny_model, history=store, companion=connect, offline=mode)
        with pytest.raises(CompanionVersionMismatch,
                           match=f"protocol version {_NEXT[0]}") as refused:
            client.generate(SUBJECT, max_new_tokens=8)
        assert refused.value.code == protocol.ErrorCode.BAD_VERSION
        assert connect.calls == 1, mode


def test_a_certificate_that_does_not_verify_raises_at_once_in_every_offline_mode(
        tiny_model, tiny_generalist, store, tmp_path) -> None:
    cert, key = make_self_signed(tmp_path / "tls")
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ssl_context=server_ssl_context(cert, key))
    with server.running() as url:
        for mode in MODES:
            untrusting = Client(tiny_model, history=store, companion=url, offline=mode,
                                ssl_context=client_ssl_context())
            with pytest.raises(CompanionTLSError, match="does not verify"):
                untrusting.generate(SUBJECT, max_new_tokens=4)
        trusting = Client(tiny_model, history=store, companion=url,
                          ssl_context=client_ssl_context(cert), offline="fail")
        assert not trusting.generate(SUBJECT, max_new_tokens=4).stats.degraded


def test_a_companion_that_is_not_there_follows_the_policy(tiny_model, store) -> None:
    """Refused connections are what may come back: degrade writes locally (and says why),
    fail raises CompanionUnavailable, wait(S) retries and then raises; `Client(offline=)` is
    the default of every call and a call's `offline=` overrides it."""
    url = f"ws://127.0.0.1:{_closed_port()}"
    local = Client(tiny_model, history=store, companion=url, connect_timeout_s=2)
    result = local.generate(SUBJECT, max_new_tokens=6)
    assert result.stats.degraded and set(result.provenance) == {"local"}
    assert url in (result.stats.offline_reason or "")
    failing = Client(tiny_model, history=store, companion=url, connect_timeout_s=2,
                     offline="fail")
    with pytest.raises(CompanionUnavailable, match="cannot reach the companion"):
        failing.generate(SUBJECT, max_new_tokens=6)
    assert failing.generate(SUBJECT, max_new_tokens=6, offline="degrade").stats.degraded
    waiting = Client(tiny_model, history=store, companion=url, connect_timeout_s=2,
                     offline=OfflinePolicy("wait", 0.3, first_retry_s=0.05))
    with pytest.raises(CompanionUnavailable, match="no companion within 0.3 s"):
        waiting.generate(SUBJECT, max_new_tokens=6)


class _RevokedAfter:
    """An in-process companion that revokes the device's token after `frames` answers (what
    `serve` sends a live connection whose token was just revoked)."""

    def __init__(self, inner: LocalChannel, frames: int) -> None:
        self.inner, self.left = inner, frames

    def send(self, frame: bytes) -> None:
        self.inner.send(frame)

    def recv(self, timeout: float) -> bytes:
        self.left -= 1
        if self.left < 0:
            return protocol.encode(protocol.Error(protocol.ErrorCode.AUTH_FAILED,
                                                  "device token revoked"))
        return self.inner.recv(timeout)

    def close(self) -> None:
        self.inner.close()


def test_a_token_revoked_mid_generation_ends_it_in_every_offline_mode(
        tiny_model, tiny_generalist, store) -> None:
    """The text so far was streamed; then `CompanionAuthError`, not local-only text."""
    verifier = Verifier(tiny_generalist, tiny_model)
    for mode in MODES:
        connect = _Counted(lambda: _RevokedAfter(LocalChannel.for_verifier(verifier), 6))
        client = Client(tiny_model, history=store, companion=connect, offline=mode)
        pieces = []
        with pytest.raises(CompanionAuthError, match="revoked"):
            for piece in client.stream(SUBJECT, max_new_tokens=200, k=2):
                pieces.append(piece)
        assert pieces and {p.provenance for p in pieces} <= {"draft", "recovered", "bonus"}
        assert connect.calls == 1, mode  # no resync, no probe


class _DownThenRefusing:
    """A companion that is not there at first, then comes back refusing every token."""

    def __init__(self, verifier: Verifier, down: int) -> None:
        self.verifier, self.down, self.calls = verifier, down, 0

    def __call__(self) -> LocalChannel:
        self.calls += 1
        if self.calls <= self.down:
            raise CompanionUnavailable("connection refused")
        return LocalChannel.for_verifier(self.verifier, authenticate=lambda token: None)


@pytest.mark.parametrize("mode", ["wait(30)", "degrade"])
def test_a_companion_that_comes_back_refusing_ends_the_wait_or_the_local_writing(
        tiny_model, tiny_generalist, store, mode) -> None:
    """Not there: the policy waits or writes locally; back but refusing the token: raised at
    the first answer (a wait of 30 s is not spent retrying, local writing does not go on)."""
    connect = _DownThenRefusing(Verifier(tiny_generalist, tiny_model), down=1)
    policy = OfflinePolicy.parse(mode)
    client = Client(tiny_model, history=store, companion=connect,
                    offline=OfflinePolicy(policy.mode, policy.wait_s, first_retry_s=0.01,
                                          max_retry_s=0.01))
    with pytest.raises(CompanionAuthError):  # no end-of-text before 4000 local tokens
        client.generate(SUBJECT, max_new_tokens=4000, min_new_tokens=4000, user_length=False)
    assert connect.calls == 2
