"""A batching companion over the network: token for token what the plain companion gives."""

from __future__ import annotations

import signal
import threading

import pytest
from helpers.budget_mail import two_mails

from specsteer.client import Client, Result
from specsteer.device import LOCAL_METHODS, METHODS
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.batching import BatchingModel
from specsteer_companion.local import LocalChannel
from specsteer_companion.process import start_companion
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier

# a batching companion process and concurrent devices: not in ./dev test --fast
pytestmark = pytest.mark.slow

QUERIES = ["Budget for the next quarter", "Meeting notes and the revised draft"]
REMOTE_METHODS = [m for m in METHODS if m not in LOCAL_METHODS]
CASES = [(query, method) for method in REMOTE_METHODS for query in QUERIES]
OPTIONS = {"max_new_tokens": 24, "offline": "fail"}


def _expected(tiny_model, tiny_generalist) -> dict[tuple[str, str], Result]:
    plain = Verifier(tiny_generalist, tiny_model)
    client = Client(tiny_model, history=two_mails(),
                    companion=lambda: LocalChannel.for_verifier(plain))
    return {(q, m): client.generate(q, method=m, **OPTIONS) for q, m in CASES}


def test_concurrent_devices_get_the_plain_companions_tokens(
    tiny_model, tiny_generalist, tiny_batched, tiny_batched_generalist
):
    expected = _expected(tiny_model, tiny_generalist)
    g, s = BatchingModel(tiny_batched_generalist), BatchingModel(tiny_batched)
    got: dict[tuple[str, str], Result] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(CASES))

    def device(case: tuple[str, str], url: str) -> None:
        try:
            client = Client(tiny_model, history=two_mails(), companion=url)
            start.wait()
            got[case] = client.generate(case[0], method=case[1], **OPTIONS)
        except BaseException as exc:  # reported below, with the case
            errors.append(exc)

    try:
        with CompanionServer(Verifier(g, s), ServerConfig(port=0)).running() as url:
            threads = [threading.Thread(target=device, args=(c, url)) for c in CASES]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
    finally:
        g.close()
        s.close()
    assert not errors, errors
    for case in CASES:
        assert got[case].tokens == expected[case].tokens, case
        assert got[case].provenance == expected[case].provenance, case
        assert not got[case].stats.degraded
    assert g.stats.rows > 0 and s.stats.rows > 0
    assert g.stats.passes <= g.stats.rows


def test_serve_batch_subprocess(tiny_model, tiny_generalist):
    """`specsteer-companion serve --batch` gives the plain companion's tokens."""
    expected = _expected(tiny_model, tiny_generalist)
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), batch=True, timeout_s=60)
    try:
        client = Client(tiny_model, history=two_mails(), companion=url)
        for query, method in CASES[:: len(QUERIES)]:
            result = client.generate(query, method=method, **OPTIONS)
            assert result.tokens == expected[(query, method)].tokens, method
    finally:
        proc.send_signal(signal.SIGINT)  # a clean stop: the companion logs its batch counters
        out, _ = proc.communicate(timeout=20)
    assert "batching: BatchStats(passes=" in out


@pytest.mark.parametrize("bad", [["--max-batch", "0"], ["--max-batch-tokens", "0"]])
def test_serve_refuses_empty_batches(bad):
    from typer.testing import CliRunner

    from specsteer_companion.cli import app

    result = CliRunner().invoke(app, ["serve", "--batch", *bad])
    assert result.exit_code != 0


def test_cross_tokenizer_sessions_batch_too(tiny_model, tiny_batched):
    """CrossVerifierSession runs unchanged on batching models (other Generalist tokenizer)."""
    from specsteer.runtime import load_model
    from specsteer.runtime.ort_batched import BatchedModel

    folder = tiny_model_dir("llama", seed=1, vocab=384)
    plain = Verifier(load_model(folder), tiny_model)
    client = Client(tiny_model, history=two_mails(),
                    companion=lambda: LocalChannel.for_verifier(plain))
    expected = client.generate(QUERIES[0], **OPTIONS)
    g, s = BatchingModel(BatchedModel(folder)), BatchingModel(tiny_batched)
    try:
        batched = Verifier(g, s)
        client = Client(tiny_model, history=two_mails(),
                        companion=lambda: LocalChannel.for_verifier(batched))
        got = client.generate(QUERIES[0], **OPTIONS)
    finally:
        g.close()
        s.close()
    assert got.tokens == expected.tokens
    assert got.provenance == expected.provenance
    assert g.stats.rows > 0
