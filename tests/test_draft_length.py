"""Adaptive draft length: the choice follows acceptance and the shape of the verification cost."""

from __future__ import annotations

import numpy as np
import pytest

from specsteer.draft_length import DraftLength


def _rate(k: int, p: float, a: float, b: float, d: float, q: float) -> float:
    tokens = (1 - p ** (k + 1)) / (1 - p)
    return tokens / (a + b * (k + 1) + (1 - p**k * q) * d * k)


def _simulate(p: float, a: float, b: float, d: float, rounds: int = 400, seed: int = 0,
              pipelined: bool = True) -> DraftLength:
    """Feed the sizer rounds drawn from a world with per-token acceptance p and known costs."""
    rng = np.random.default_rng(seed)
    sizer = DraftLength(4, 1, 8, pipelined)
    k = sizer.k
    for _ in range(rounds):
        accepted = 0
        while accepted < k and rng.random() < p:
            accepted += 1
        latency = a + b * (k + 1) + rng.normal(0, 0.005)
        bet = (accepted == k and rng.random() < 0.9) if pipelined else None
        k = sizer.observe(k, accepted, k + 1, latency, d, bet)
    return sizer


@pytest.mark.parametrize("p", [0.5, 0.73, 0.91, 0.97])
def test_converges_to_the_best_k_of_a_cpu_like_companion(p):
    a, b, d = 0.110, 0.060, 0.043  # Qwen 1.5B int8 verify pass and Qwen 0.5B draft step, 1 core
    sizer = _simulate(p, a, b, d)
    rates = {k: _rate(k, p, a, b, d, 0.9) for k in range(1, 9)}
    best = max(rates, key=rates.get)
    assert rates[sizer.k] >= 0.95 * rates[best], (sizer.k, best, rates)
    assert abs(sizer.acceptance - p) < 0.15


def test_weak_drafts_get_short_rounds_and_strong_ones_long_rounds():
    a, b, d = 0.110, 0.060, 0.043
    weak, strong = _simulate(0.6, a, b, d).k, _simulate(0.97, a, b, d).k
    assert weak <= 2 and strong >= weak + 2


def test_a_flat_verification_cost_favours_the_longest_drafts():
    """A GPU companion: verifying 9 tokens costs what verifying 2 does."""
    sizer = _simulate(0.9, 0.05, 0.0, 0.002)
    assert sizer.k == sizer.k_max


def test_the_cost_fit_recovers_the_line_it_is_fed():
    sizer = DraftLength(4, 1, 8)
    for n in [2, 3, 5, 6, 4, 2, 7, 5, 3, 6] * 3:
        sizer.observe(n - 1, n - 1, n, 0.1 + 0.05 * n, 0.01, None)
    a, b = sizer.verify_cost()
    assert a == pytest.approx(0.1, abs=0.01) and b == pytest.approx(0.05, abs=0.005)


def test_no_latency_keeps_the_starting_k():
    sizer = DraftLength(3, 1, 8)
    assert sizer.observe(3, 0, 4, None) == 3


def test_probes_on_both_sides_of_the_current_k():
    sizer = DraftLength(4, 1, 8, probe_every=2)
    chosen = [sizer.observe(2, 2, 3, None) for _ in range(8)]
    assert chosen == [4, 6, 4, 2, 4, 6, 4, 2]


@pytest.mark.parametrize("bad", [dict(k=0), dict(k=9), dict(k_min=3, k=2)])
def test_bounds_are_checked(bad):
    with pytest.raises(ValueError):
        DraftLength(**{"k": 4, "k_min": 1, "k_max": 8, **bad})
