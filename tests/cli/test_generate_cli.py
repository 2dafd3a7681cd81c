"""`specsteer generate` through the real Typer app against a networked companion (tiny models)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specsteer.cli import app
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier

pytestmark = pytest.mark.slow  # CLI runs of whole generations: not in ./dev test --fast

runner = CliRunner()
SUBJECT = "Budget for the next quarter"


def generate(url: str, *options: str) -> dict:
    result = runner.invoke(app, [
        "generate", SUBJECT, "--specialist", str(tiny_model_dir("llama", seed=0)),
        "--companion", url, "--max-new-tokens", "24", "--json", *options,
    ])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_preset_is_not_overridden_by_option_defaults(tiny_model, tiny_generalist) -> None:
    """`--preset fast` means gamma 0.1 and top_k 32 unless the command line says otherwise
    (a default of 64 on --top-k once silently undid the preset's candidate cut)."""
    with CompanionServer(Verifier(tiny_generalist, tiny_model)).running() as url:
        fast = generate(url, "--preset", "fast")
        spelled_out = generate(url, "--gamma", "0.1", "--top-k", "32")
        top_64 = generate(url, "--gamma", "0.1", "--top-k", "64")
        overridden = generate(url, "--preset", "fast", "--top-k", "64")
    assert not fast["stats"]["degraded"]
    assert fast["text"] == spelled_out["text"] and _wire(fast) == _wire(spelled_out)
    # 32 candidates a round travel in fewer bytes than 64 (the tiny vocabulary has 512 ids)
    assert fast["stats"]["bytes_down"] < top_64["stats"]["bytes_down"]
    assert _wire(overridden) == _wire(top_64)


def _wire(result: dict) -> dict:
    return {k: result["stats"][k] for k in ("bytes_down", "rounds", "accepted", "drafted")}
