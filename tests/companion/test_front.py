"""`server.WebSocketFront`, the websocket side every companion server shares: a plain GET
/stats is answered with the server's `http_stats()` as JSON where it has one (the Ray ingress's
per-replica counts), and refused as a non-websocket request where it has none."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from specsteer.client import Client
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url.replace("ws://", "http://") + "/stats",
                                    timeout=10) as reply:
            return reply.status, reply.headers.get_all("Content-Type"), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_all("Content-Type"), exc.read().decode()


def test_stats_page_only_where_the_server_has_one(tiny_model, tiny_generalist):
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(host="127.0.0.1", port=0, workers=1))
    with server.running() as url:
        status, _, _ = _get(url)
        assert status == 426  # websockets' answer to a request that is not an upgrade
        server.http_stats = lambda: {"open_connections": server.open_connections()}
        status, kinds, body = _get(url)
        assert status == 200 and kinds == ["application/json"]
        assert json.loads(body) == {"open_connections": 0}  # not counting the page's own
        result = Client(tiny_model, companion=url).generate("Budget", max_new_tokens=4,
                                                            offline="fail")
        assert not result.stats.degraded  # websockets are served beside the page
    assert not server.listening


@pytest.mark.parametrize("path", ["/", "/stats/", "/other"])
def test_other_paths_are_not_the_page(tiny_model, tiny_generalist, path):
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(host="127.0.0.1", port=0, workers=1))
    server.http_stats = lambda: {"secret": 1}
    with server.running() as url:
        try:
            urllib.request.urlopen(url.replace("ws://", "http://") + path, timeout=10)
            raise AssertionError("answered")
        except urllib.error.HTTPError as exc:
            assert exc.code == 426 and b"secret" not in exc.read()
