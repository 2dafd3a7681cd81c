"""Chunked, cancellable prefill (`Track.prefill`) and the device's default thread count."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from counting import CountingSession

from specsteer.errors import GenerationCancelled
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer.runtime.onnx import default_threads
from specsteer.runtime.track import Track, common_prefix


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
    assert track.retarget(changed, changed) == len(changed) - 1  # the last token runs again


def test_device_threads_default_to_the_usable_cores():
    assert default_threads() == len(os.sched_getaffinity(0))
    assert load_model(tiny_model_dir("llama", seed=0)).threads == default_threads()
    assert load_model(tiny_model_dir("llama", seed=0), threads=1).threads == 1
    with pytest.raises(ValueError, match="threads"):
        load_model(tiny_model_dir("llama", seed=0), threads=0)
