"""Chunked, cancellable prefill (`Track.prefill`) and the device's default thread count."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from helpers.counting import CountingSession

from specsteer.errors import GenerationCancelled
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer.runtime.onnx import default_threads
from specsteer.runtime.track import PrefillPace, Track, common_prefix, model_pace


def _prompt(model, n: int) -> list[int]:
    rng = np.random.default_rng(7)
    return [int(t) for t in rng.integers(3, model.vocab_size - 1, n)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 128])
def test_chunked_prefill_gives_the_one_shot_logits(tiny_model, chunk):
    prompt = _prompt(tiny_model, 300)
    whole = Track(tiny_model, prompt, 400, chunk=10_000)
    chunked = Track(tiny_model, prompt, 400, chunk=chunk)
    np.testing.assert_allclose(chunked.row, whole.row, atol=1e-4)
    for token in (5, 9, 11):  # and the positions after it, from the KV the chunks wrote
        np.testing.assert_allclose(chunked.push(token), whole.push(token), atol=1e-4)
    assert chunked.length == whole.length == 303
    assert np.argmax(chunked.row) == np.argmax(whole.row)


def test_a_cancelled_prefill_stops_at_a_chunk_boundary_and_resumes(tiny_model):
    prompt = _prompt(tiny_model, 300)
    cancel = threading.Event()
    track = Track(tiny_model, prompt, 400, lazy=True, chunk=64)
    track.session = counting = CountingSession(track.session, cancel, after=2)
    with pytest.raises(GenerationCancelled):
        track.prefill(cancel)
    assert counting.passes == [64, 64]  # the third chunk never ran
    assert track.session.length == 128 and track.pending == 172
    track.prefill()  # resumes where it stopped
    assert counting.passes == [64, 64, 64, 64, 44] and track.pending == 0
    np.testing.assert_allclose(track.row, Track(tiny_model, prompt, 400).row, atol=1e-4)


def test_retarget_keeps_the_common_prefix_only(tiny_model):
    first = _prompt(tiny_model, 200)
    changed = [*first[:150], *_prompt(tiny_model, 30)[::-1]]
    track = Track(tiny_model, first, 400)
    track.session = counting = CountingSession(track.session)
    kept = track.retarget(first, changed)
    assert kept == common_prefix(first, changed) == 150
    track.prefill()
    assert sum(counting.passes) == len(changed) - 150
    np.testing.assert_allclose(track.row, Track(tiny_model, changed, 400).row, atol=1e-4)
    # holding exactly the prompt, with its row: nothing runs again
    assert track.retarget(changed, changed) == len(changed) and track.pending == 0
    assert sum(counting.passes) == len(changed) - 150


def test_retarget_runs_the_last_token_again_when_the_row_may_be_stale(tiny_model):
    prompt = _prompt(tiny_model, 100)
    track = Track(tiny_model, prompt, 400)
    expected = track.row.copy()
    track.push(5)
    track.push(9)
    track.session.rewind(len(prompt))  # as a lost bet does: the row is the pushed token's
    assert track.retarget(prompt, prompt) == len(prompt) - 1 and track.pending == 1
    np.testing.assert_allclose(track.row, expected, atol=1e-4)


def test_device_threads_default_to_the_usable_cores():
    assert default_threads() == len(os.sched_getaffinity(0))
    assert load_model(tiny_model_dir("llama", seed=0)).threads == default_threads()
    assert load_model(tiny_model_dir("llama", seed=0), threads=1).threads == 1
    with pytest.raises(ValueError, match="threads"):
        load_model(tiny_model_dir("llama", seed=0), threads=0)


def test_a_pace_sizes_passes_from_the_last_rate():
    pace = PrefillPace(seconds=0.1, low=8, high=128)
    assert pace.size() == 8  # no rate yet: the fewest tokens
    pace.observe(20, 0.1)  # 200 tokens/s: 20 tokens in 0.1 s
    assert pace.size() == 20
    pace.observe(64, 0.01)  # fast: capped at `high`
    assert pace.size() == 128
    pace.observe(8, 1.0)  # slow: never below `low`
    assert pace.size() == 8
    pace.observe(0, 0.0)  # nothing measured: the rate stands
    assert pace.rate == 8.0
    with pytest.raises(ValueError):
        PrefillPace(seconds=0)
    with pytest.raises(ValueError):
        PrefillPace(low=9, high=8)


def test_a_paced_prefill_starts_small_and_stays_within_bounds(tiny_model):
    prompt = _prompt(tiny_model, 300)
    pace = PrefillPace(seconds=0.1, low=8, high=64)
    track = Track(tiny_model, prompt, 400, lazy=True, pace=pace)
    track.session = counting = CountingSession(track.session)
    track.prefill()
    assert counting.passes[0] == 8 and sum(counting.passes) == 300
    assert all(8 <= n <= 64 for n in counting.passes[:-1]) and pace.rate is not None
    np.testing.assert_allclose(track.row, Track(tiny_model, prompt, 400).row, atol=1e-4)


def test_a_cancelled_paced_prefill_keeps_exactly_the_passes_it_ran(tiny_model):
    prompt = _prompt(tiny_model, 300)
    cancel = threading.Event()
    track = Track(tiny_model, prompt, 400, lazy=True, pace=PrefillPace(low=8, high=32))
    track.session = counting = CountingSession(track.session, cancel, after=3)
    with pytest.raises(GenerationCancelled):
        track.prefill(cancel)
    assert len(counting.passes) == 3  # it stopped at the boundary after the third pass
    ran = sum(counting.passes)
    assert track.session.length == ran and track.pending == 300 - ran
    track.prefill()
    np.testing.assert_allclose(track.row, Track(tiny_model, prompt, 400).row, atol=1e-4)


def test_each_model_has_one_shared_pace(tiny_model, tiny_generalist):
    assert model_pace(tiny_model) is model_pace(tiny_model)
    assert model_pace(tiny_model) is not model_pace(tiny_generalist)
