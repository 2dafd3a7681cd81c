"""The companion killed mid-stream: the bridge's stream goes on offline, marked `local`."""

from __future__ import annotations

import signal

import pytest
from helpers.bridge_process import assert_valid

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast


def test_companion_killed_mid_stream_continues_locally(spawn) -> None:
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120)
    try:
        bridge = spawn("--companion", url, "--timeout-s", "5")
        request = bridge.send("generate", {"query": "Budget", "max_new_tokens": 600})
        bridge.wait_for(lambda f: f["method"] == "generate.piece"
                        and f["params"]["provenance"] != "local")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        mode = bridge.wait_for(lambda f: f["method"] == "generate.mode")["params"]
        assert_valid("generate.mode", "params", mode)
        assert mode["id"] == request and mode["mode"] == "local" and mode["tokens"] > 0
        result = bridge.answer(request, timeout=120)["result"]
        provenance = result["provenance"]
        assert provenance[0] != "local" and provenance[-1] == "local"
        assert "local" not in provenance[: mode["tokens"]]
        assert set(provenance[mode["tokens"]:]) == {"local"}
        assert result["stats"]["degraded"] and result["stats"]["offline_reason"]
        pieces = bridge.stream_of(request)
        assert "".join(p["text"] for p in pieces) == result["text"]
        assert bridge.call("status")["result"]["last_mode"] == "local"
        assert bridge.close() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
