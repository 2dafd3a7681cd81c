"""The device–companion link over real sockets: tokens, TLS, limits, the canary over wss://."""

from __future__ import annotations

import time

import pytest
from helpers.privacy_audit import assert_canary_not_sent

from specsteer import protocol
from specsteer.client import Client
from specsteer.errors import CompanionAuthError, CompanionError, CompanionTLSError
from specsteer.history import HistoryStore
from specsteer.protocol import ErrorCode
from specsteer_companion.auth import TokenStore
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.tls import client_ssl_context, make_self_signed, server_ssl_context
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

CANARY = "QWV-CANARY-5520-heron"


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    history.add(kind="email", title="Team offsite", body=f"Dear all, the offsite is set. {CANARY}")
    return history


@pytest.fixture()
def tokens(tmp_path) -> TokenStore:
    return TokenStore(tmp_path / "tokens.db")


def _tampered(secret: str) -> str:
    """The secret with its last character changed (never to itself)."""
    return secret[:-1] + ("A" if secret[-1] != "A" else "B")


def _auth(tokens: TokenStore):
    return lambda secret: info.token_id if (info := tokens.verify(secret)) else None


def test_tokens_valid_missing_wrong_and_revoked(tiny_model, tiny_generalist, store, tokens):
    issued = tokens.create("alice-laptop")
    other = tokens.create("bob-phone")
    server = CompanionServer(Verifier(tiny_generalist, tiny_model), authenticate=_auth(tokens))
    with server.running() as url:
        ok = Client(tiny_model, history=store, companion=url, token=issued.secret)
        assert not ok.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded
        missing = Client(tiny_model, history=store, companion=url)  # no token at all
        for client in [missing, *(Client(tiny_model, history=store, companion=url, token=bad)
                                  for bad in ["sst_0000000000000000_" + "x" * 43,
                                              _tampered(issued.secret)])]:
            with pytest.raises(CompanionAuthError) as info:
                client.generate("Team offsite", max_new_tokens=8, offline="fail")
            assert info.value.code == ErrorCode.AUTH_FAILED
        assert tokens.revoke(other.token_id)
        revoked = Client(tiny_model, history=store, companion=url, token=other.secret)
        with pytest.raises(CompanionAuthError, match="revoked"):
            revoked.generate("Team offsite", max_new_tokens=8, offline="fail")
        # a refused token is a configuration mistake, not "offline": the default policy
        # raises too instead of writing local-only text (tests/e2e/test_config_errors.py)
        with pytest.raises(CompanionAuthError, match="revoked"):
            revoked.generate("Team offsite", max_new_tokens=8)


def test_canary_over_tls(tiny_model, tiny_generalist, store, tmp_path):
    cert, key = make_self_signed(tmp_path / "tls")
    server = CompanionServer(
        Verifier(tiny_generalist, tiny_model), ssl_context=server_ssl_context(cert, key)
    )
    frames: list[tuple[str, bytes]] = []
    with server.running() as url:
        assert url.startswith("wss://")
        client = Client(
            tiny_model,
            history=store,
            companion=url,
            ssl_context=client_ssl_context(cert),
            tap=lambda d, f: frames.append((d, f)),
        )
        result = client.generate("Team offsite", max_new_tokens=24, offline="fail")
        assert CANARY in result.prompt.with_context
        assert_canary_not_sent(tiny_model.tokenizer, frames, CANARY)
        # a client that does not trust the certificate cannot connect
        untrusting = Client(
            tiny_model, history=store, companion=url, ssl_context=client_ssl_context()
        )
        with pytest.raises(CompanionTLSError):
            untrusting.generate("Team offsite", max_new_tokens=4, offline="fail")


def test_session_quota_per_identity(tiny_model, tiny_generalist, store, tokens):
    from specsteer.link import CompanionLink
    from specsteer.transport import WebSocketChannel

    issued = tokens.create("carol-tablet")
    server = CompanionServer(
        Verifier(tiny_generalist, tiny_model),
        ServerConfig(port=0, max_sessions_per_identity=2),
        authenticate=_auth(tokens),
    )
    session = protocol.SessionSettings(top_k=8)
    with server.running() as url:
        links = []
        for _ in range(2):
            link = CompanionLink(WebSocketChannel(url))
            link.hello(auth_token=issued.secret)
            link.open([1, 2, 3], session)
            links.append(link)
        third = CompanionLink(WebSocketChannel(url))
        third.hello(auth_token=issued.secret)
        with pytest.raises(CompanionError) as info:
            third.open([1, 2, 3], session)
        assert info.value.code == ErrorCode.SESSION_LIMIT
        links[0].close()
        time.sleep(0.2)  # the server notices the close
        again = Client(tiny_model, history=store, companion=url, token=issued.secret)
        assert not again.generate("Team offsite", max_new_tokens=4, offline="fail").stats.degraded
        # open mode: client names are not identities, so many SDK devices can share a companion
    open_server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                                  ServerConfig(port=0, max_sessions_per_identity=1))
    with open_server.running() as url:
        held = []
        for _ in range(3):
            link = CompanionLink(WebSocketChannel(url))
            link.hello(client_name="specsteer-python")
            link.open([1, 2, 3], session)
            held.append(link)
        for link in held:
            link.close()
