"""Unit and property tests of specsteer.steer: the method, checked against docs/method.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from specsteer import steer
from specsteer.steer import (
    SparseSteer,
    classic_accept_greedy,
    classic_accept_sampling,
    costeer,
    fuse,
    light_costeer,
    log_softmax,
    pick,
    ratio_accept_count,
    sample_index,
    sparse_steer,
    token_logprobs,
    top_k_ids,
)

settings.register_profile("steer", deadline=None, max_examples=60)
settings.load_profile("steer")

LOGIT = st.floats(-30.0, 30.0, allow_nan=False, allow_infinity=False)
LOGP = st.floats(-50.0, 0.0, allow_nan=False, allow_infinity=False)


def logps(n: int) -> st.SearchStrategy[np.ndarray]:
    """K per-draft log-probs (not a distribution: one number per drafted token)."""
    return arrays(np.float64, n, elements=LOGP)


@st.composite
def logp_rows(draw: st.DrawFn, count: int, min_len: int = 1, max_len: int = 12) -> tuple:
    """`count` normalised log-prob rows of one common length."""
    n = draw(st.integers(min_len, max_len))
    return tuple(log_softmax(draw(arrays(np.float64, n, elements=LOGIT))) for _ in range(count))


def within_binomial(hits: int, n: int, p: float, z: float = 5.0) -> bool:
    """Empirical frequency within z standard errors of p (seeded, so this is not flaky)."""
    return abs(hits / n - p) <= z * math.sqrt(p * (1 - p) / n) + 1e-12


# --------------------------------------------------------------------------- log_softmax


def test_log_softmax_is_stable_for_huge_logits() -> None:
    out = log_softmax(np.array([1e30, 1e30, -1e30], dtype=np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:2], [-math.log(2)] * 2, rtol=1e-6)
    assert out[2] < -1e29
    wide = log_softmax(np.array([1e300, 1e300], dtype=np.float64))  # beyond float32's range
    np.testing.assert_allclose(wide, [-math.log(2)] * 2, rtol=1e-6)
    masked = log_softmax(np.array([0.0, -np.inf, 0.0]))
    assert np.isneginf(masked[1]) and np.allclose(masked[[0, 2]], -math.log(2))


def test_log_softmax_temperature_and_last_axis() -> None:
    z = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 9.0]])
    np.testing.assert_allclose(log_softmax(z, 2.0), log_softmax(z / 2.0), rtol=1e-6)
    for t in (0.0, -1.0, 1.0):
        np.testing.assert_array_equal(log_softmax(z, t), log_softmax(z))
    np.testing.assert_allclose(np.exp(log_softmax(z)).sum(axis=-1), [1.0, 1.0], rtol=1e-6)


@given(arrays(np.float64, st.integers(1, 20), elements=LOGIT), st.floats(-1e4, 1e4))
def test_log_softmax_normalised_and_shift_invariant(z: np.ndarray, shift: float) -> None:
    out = log_softmax(z)
    assert math.isclose(float(np.exp(out.astype(np.float64)).sum()), 1.0, rel_tol=1e-5)
    np.testing.assert_allclose(log_softmax(z + shift), out, atol=2e-3)


def test_token_logprobs_shapes_and_values() -> None:
    logits = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32)
    out = token_logprobs(logits, [0, 6, 2])
    assert out.shape == (3,) and out.dtype == np.float32
    full = log_softmax(logits)
    np.testing.assert_array_equal(out, [full[0, 0], full[1, 6], full[2, 2]])
    assert token_logprobs(np.zeros((0, 7)), []).shape == (0,)
    with pytest.raises(ValueError):
        token_logprobs(logits, [0, 1])
    with pytest.raises(ValueError):
        token_logprobs(logits[0], [0])


# --------------------------------------------------------------------------- Verify


@given(st.integers(0, 10).flatmap(lambda k: st.tuples(logps(k), logps(k))), st.integers(0, 99))
def test_gamma_to_zero_accepts_everything(pair: tuple, seed: int) -> None:
    g, s0 = pair
    for gamma in (0.0, 1e-300):
        assert ratio_accept_count(g, s0, gamma) == len(g)
        assert ratio_accept_count(g, s0, gamma, np.random.default_rng(seed)) == len(g)


def test_gamma_zero_accepts_even_impossible_tokens() -> None:
    g = np.array([-np.inf, -1.0, -np.inf])
    assert ratio_accept_count(g, np.array([-1.0, -np.inf, -np.inf]), 0.0) == 3


@given(
    st.integers(1, 10).flatmap(logps),
    st.floats(0.0, 1.0),
    st.floats(1.001, 100.0),
    st.integers(0, 99),
)
def test_identical_models_accept_all_iff_gamma_at_most_one(
    g: np.ndarray, gamma_low: float, gamma_high: float, seed: int
) -> None:
    assert ratio_accept_count(g, g.copy(), gamma_low) == len(g)
    assert ratio_accept_count(g, g.copy(), gamma_low, np.random.default_rng(seed)) == len(g)
    assert ratio_accept_count(g, g.copy(), gamma_high) == 0


def test_identical_models_accept_at_any_magnitude() -> None:
    g = np.array([-1e20, -3.5, -0.0], dtype=np.float32)
    assert ratio_accept_count(g, g, 1.0) == 3
    assert ratio_accept_count(g, g, 0.5) == 3


def test_first_reject_stops_counting() -> None:
    s0 = np.full(5, -2.0)
    g = np.array([-2.0, -2.5, -9.0, -1.0, -1.0])  # draft 2 fails; 3 and 4 would pass
    assert ratio_accept_count(g, s0, 0.5) == 2
    assert ratio_accept_count(g, s0, 0.0) == 5
    assert ratio_accept_count(g, s0, 1.0) == 1
    assert ratio_accept_count(np.array([]), np.array([]), 0.5) == 0


def test_ratio_threshold_boundary_and_edge_values() -> None:
    s0 = np.log([0.5])
    assert ratio_accept_count(np.log([0.26]), s0, 0.5) == 1  # 0.26 >= 0.25
    assert ratio_accept_count(np.log([0.24]), s0, 0.5) == 0
    assert ratio_accept_count(np.array([-np.inf]), np.array([-1.0]), 0.1) == 0  # P_G = 0
    assert ratio_accept_count(np.array([-1.0]), np.array([-np.inf]), 10.0) == 1  # P_S0 = 0
    assert ratio_accept_count(np.array([np.nan]), np.array([-1.0]), 0.5) == 0
    with pytest.raises(ValueError):
        ratio_accept_count(np.zeros(2), np.zeros(3), 0.5)
    with pytest.raises(ValueError):
        ratio_accept_count(np.zeros(2), np.zeros(2), -0.1)


@pytest.mark.parametrize("ratio", [0.2, 0.65])
def test_sampling_acceptance_frequency_is_min_one_ratio(ratio: float) -> None:
    gamma, s0 = 0.5, np.array([math.log(0.3)])
    g = np.array([math.log(ratio * gamma * 0.3)])  # P_G / (gamma * P_S0) == ratio
    rng, n = np.random.default_rng(1234), 20_000
    hits = sum(ratio_accept_count(g, s0, gamma, rng) for _ in range(n))
    assert within_binomial(hits, n, ratio)
    assert all(ratio_accept_count(g + 1.0, s0, gamma * 0.3, rng) == 1 for _ in range(200))


def test_sampling_stops_at_first_reject_geometrically() -> None:
    ratios = np.array([0.8, 0.5, 0.9])
    s0 = np.full(3, -1.0)
    g = np.log(ratios) + s0  # gamma = 1
    rng, n = np.random.default_rng(99), 20_000
    counts = np.bincount([ratio_accept_count(g, s0, 1.0, rng) for _ in range(n)], minlength=4)
    expected = [0.2, 0.8 * 0.5, 0.8 * 0.5 * 0.1, 0.8 * 0.5 * 0.9]
    for hits, p in zip(counts, expected, strict=True):
        assert within_binomial(int(hits), n, p)


# --------------------------------------------------------------------------- Recover


@given(logp_rows(3, max_len=40), st.integers(1, 50), st.sampled_from(["generalist", "difference"]))
def test_alpha_zero_recovery_picks_generalist_best(rows: tuple, k: int, select: str) -> None:
    g, s0, sc = rows
    steer = sparse_steer(g, s0, alpha=0.0, top_k=k, select=select)
    assert pick(steer.ids, fuse(steer, sc, alpha=0.0)) == int(np.argmax(g))


@given(logp_rows(3, min_len=2, max_len=40), st.integers(1, 40), st.integers(1, 40))
def test_fewer_candidates_pick_the_same_token_iff_it_ranks_within_them(
    rows: tuple, small: int, extra: int
) -> None:
    """Why the `fast` preset may carry top_k=32 (bench/candidates.py): a smaller candidate set
    keeps the greedy recovery exactly when the larger set's pick ranks within its top of logp_G."""
    g, s0, sc = rows
    large = small + extra

    def choice(k: int) -> int:
        steer = sparse_steer(g, s0, alpha=1.0, top_k=k)
        return pick(steer.ids, fuse(steer, sc, alpha=1.0))

    chosen = choice(large)
    ranks_within = chosen in set(top_k_ids(g, small).tolist())
    assert (choice(small) == chosen) == ranks_within


def test_difference_selection_differs_from_generalist() -> None:
    # token 5: the Generalist finds it unlikely, the generic Specialist far more so
    g = log_softmax(np.array([5.0, 4.0, 3.0, 0.0, 0.0, -3.0]))
    s0 = log_softmax(np.array([5.0, 4.0, 3.0, 0.0, 0.0, -30.0]))
    by_g = sparse_steer(g, s0, alpha=1.0, top_k=2)
    by_diff = sparse_steer(g, s0, alpha=1.0, top_k=2, select="difference")
    assert by_g.ids.tolist() == [0, 1]
    assert by_diff.ids[0] == 5 and 5 not in by_g.ids
    with pytest.raises(ValueError):
        sparse_steer(g, s0, alpha=1.0, top_k=2, select="bogus")


def test_sparse_steer_values_are_fp16_on_the_wire() -> None:
    g = np.array([-0.1, -1 / 3, -2.0, -7.0])
    s0 = np.array([-0.7, -0.2, -1.1, -0.3])
    steer = sparse_steer(g, s0, alpha=1.5, top_k=3)
    assert steer.ids.dtype == np.int32 and steer.values.dtype == np.float16
    exact = (g - 1.5 * s0)[steer.ids]
    np.testing.assert_array_equal(steer.values, exact.astype(np.float16))
    assert not np.array_equal(steer.values.astype(np.float64), exact)  # rounding happened
    assert sparse_steer(g, s0, 1.0, top_k=100).ids.tolist() == [0, 1, 2, 3]  # k > V


@given(arrays(np.int8, st.integers(1, 30), elements=st.integers(-3, 3)), st.integers(0, 35))
def test_top_k_ids_breaks_ties_by_lowest_id(scores: np.ndarray, k: int) -> None:
    expected = np.argsort(-scores.astype(np.float64), kind="stable")[:k]
    np.testing.assert_array_equal(top_k_ids(scores, k), expected)


def test_top_k_ids_treats_nan_as_minus_inf() -> None:
    assert top_k_ids(np.array([np.nan, 1.0, -np.inf, 0.0]), 3).tolist() == [1, 3, 0]


@pytest.mark.parametrize("select", ["generalist", "difference"])
def test_fuse_pick_alpha_one_matches_hand_computation(select: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        g, s0, sc = (log_softmax(rng.normal(scale=3.0, size=40)) for _ in range(3))
        steer = sparse_steer(g, s0, alpha=1.0, top_k=8, select=select)
        best, best_score = -1, -math.inf
        for i, v in zip(steer.ids.tolist(), steer.values.tolist(), strict=True):
            score = float(np.float32(v) + np.float32(sc[i]))  # wire value + private term
            if score > best_score:
                best, best_score = i, score
        assert pick(steer.ids, fuse(steer, sc, alpha=1.0)) == best


def test_private_context_flips_the_recovery() -> None:
    g = log_softmax(np.array([2.0, 1.8, 0.0, 0.0]))  # Generalist slightly prefers token 0
    s0 = log_softmax(np.array([1.0, 1.0, 0.0, 0.0]))
    sc = log_softmax(np.array([1.0, 4.0, 0.0, 0.0]))  # the context strongly supports token 1
    steer = sparse_steer(g, s0, alpha=1.0, top_k=2)
    assert pick(steer.ids, fuse(steer, sc, alpha=1.0)) == 1
    assert pick(steer.ids, fuse(steer, sc, alpha=0.0)) == 0


def test_sparse_steer_validation_and_equality() -> None:
    a = SparseSteer(ids=np.array([3, 1]), values=np.array([0.5, -1.0]))
    assert a.ids.dtype == np.int32 and a.values.dtype == np.float16
    assert a == SparseSteer(ids=[3, 1], values=[0.5, -1.0]) and hash(a) == hash(
        SparseSteer(ids=[3, 1], values=[0.5, -1.0])
    )
    assert a != SparseSteer(ids=[1, 3], values=[0.5, -1.0])
    with pytest.raises(ValueError):
        a.ids[0] = 9
    for ids, values in (([1, 2], [0.0]), ([-1], [0.0]), ([2, 2], [0.0, 0.0])):
        with pytest.raises(ValueError):
            SparseSteer(ids=np.array(ids), values=np.array(values))


def test_pick_greedy_ties_first_and_sampling_follows_softmax() -> None:
    ids = np.array([10, 20, 30])
    assert pick(ids, np.array([1.0, 3.0, 3.0])) == 20
    assert pick(ids, np.array([np.nan, 0.0, -1.0])) == 20
    scores, temp = np.array([0.0, 1.0, 2.0]), 2.0
    rng, n = np.random.default_rng(5), 20_000
    draws = np.array([pick(ids, scores, temp, rng) for _ in range(n)])
    probs = np.exp(log_softmax(scores, temp).astype(np.float64))
    for tok, p in zip(ids, probs, strict=True):
        assert within_binomial(int((draws == tok).sum()), n, float(p))
    with pytest.raises(ValueError):
        pick(ids, scores, temperature=1.0)
    with pytest.raises(ValueError):
        pick(ids, np.full(3, -np.inf), temperature=1.0, rng=rng)


def test_sample_index_never_returns_zero_weight() -> None:
    class AlmostOne:
        def random(self) -> float:
            return 1.0 - 2**-53

    assert sample_index(np.array([0.0, 1.0, 0.0, 0.0]), AlmostOne()) == 1  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sample_index(np.zeros(3), np.random.default_rng(0))


# --------------------------------------------------------------------------- classic SD


def _one_hot_logits(best: list[int], vocab: int = 6) -> np.ndarray:
    z = np.zeros((len(best), vocab))
    z[np.arange(len(best)), best] = 5.0
    return z


def test_classic_greedy_all_match_gives_bonus() -> None:
    assert classic_accept_greedy([1, 2, 3], _one_hot_logits([1, 2, 3, 4])) == (3, 4)
    assert classic_accept_greedy([], _one_hot_logits([5])) == (0, 5)


def test_classic_greedy_mismatch_gives_correction() -> None:
    assert classic_accept_greedy([1, 0, 3], _one_hot_logits([1, 2, 3, 4])) == (1, 2)
    assert classic_accept_greedy([0, 2, 3], _one_hot_logits([1, 2, 3, 4])) == (0, 1)
    with pytest.raises(ValueError):
        classic_accept_greedy([1, 2], _one_hot_logits([1, 2]))


@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(2, 10))
def test_classic_sampling_identical_models_always_accept(seed: int, k: int, vocab: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.5), size=k + 1)
    draft = [int(rng.choice(vocab, p=p[i])) for i in range(k)]
    n, token = classic_accept_sampling(draft, p[:k].copy(), p, rng)
    assert n == k and 0 <= token < vocab and p[k, token] > 0


@pytest.mark.parametrize("k", [1, 2])
def test_classic_sampling_output_distribution_is_target(k: int) -> None:
    rng, vocab, n = np.random.default_rng(2024), 6, 20_000
    q = rng.dirichlet(np.ones(vocab), size=k)
    p = rng.dirichlet(np.ones(vocab), size=k + 1)
    first = np.empty(n, dtype=np.int64)
    for t in range(n):
        draft = [sample_index(q[i], rng) for i in range(k)]
        accepted, token = classic_accept_sampling(draft, q, p, rng)
        first[t] = draft[0] if accepted > 0 else token
    freq = np.bincount(first, minlength=vocab) / n
    assert 0.5 * np.abs(freq - p[0]).sum() < 0.02  # total variation; q alone would be far off
    assert 0.5 * np.abs(q[0] - p[0]).sum() > 0.1
    for hits, prob in zip(np.bincount(first, minlength=vocab), p[0], strict=True):
        assert within_binomial(int(hits), n, float(prob))


def test_classic_sampling_rejects_token_target_rules_out() -> None:
    q = np.array([[0.5, 0.5, 0.0]])
    p = np.array([[0.0, 0.2, 0.8], [1.0, 0.0, 0.0]])
    n, token = classic_accept_sampling([0], q, p, np.random.default_rng(0))
    assert n == 0 and token == 2  # residual max(0, p - q) = [0, 0, 0.8]


# --------------------------------------------------------------------------- (Light)CoSteer


@given(logp_rows(3, max_len=30), st.booleans())
def test_costeer_zero_delta_returns_generalist(rows: tuple, sub_row: bool) -> None:
    g, s, _ = rows
    if sub_row:  # a candidate set: unnormalised slice, renormalised by the loop
        g, s = g[: max(1, len(g) // 2)], s[: max(1, len(s) // 2)]
    out = costeer(g, s, s.copy())
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, log_softmax(g), atol=1e-4)


def _hand_log_softmax(x: list[float]) -> list[float]:
    m = max(x)
    lse = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def test_costeer_one_and_two_iterations_match_hand_computation() -> None:
    a, beta, lam, eta = 2.0, 1.0, 2.0, 10.0
    pi0 = _hand_log_softmax([2.0, 1.0, 0.0])
    sc, s0 = _hand_log_softmax([0.0, 2.0, 0.0]), _hand_log_softmax([0.0, 0.0, 0.0])
    delta = [x - y for x, y in zip(sc, s0, strict=True)]
    u = [beta * d for d in delta]  # t=1: pi == pi0, so a*(pi - pi0) == 0
    pi1 = _hand_log_softmax(
        [(lam * p0 + ui + p0 / eta) / (lam + 1 / eta) for p0, ui in zip(pi0, u, strict=True)]
    )
    u = [ui + a * (p - p0) + beta * d for ui, p, p0, d in zip(u, pi1, pi0, delta, strict=True)]
    pi2 = _hand_log_softmax(
        [
            (2 * lam * p0 + ui + p / eta) / (2 * lam + 1 / eta)
            for p0, ui, p in zip(pi0, u, pi1, strict=True)
        ]
    )
    got1 = costeer(np.array(pi0), np.array(sc), np.array(s0), iterations=1)
    got2 = costeer(np.array(pi0), np.array(sc), np.array(s0), iterations=2)
    np.testing.assert_allclose(got1, pi1, rtol=1e-6)
    np.testing.assert_allclose(got2, pi2, rtol=1e-6)
    assert got1[1] > pi0[1]  # the context pushed mass toward token 1
    got0 = costeer(np.array(pi0), np.array(sc), np.array(s0), iterations=0)
    np.testing.assert_allclose(got0, pi0, rtol=1e-6)


def test_costeer_keeps_impossible_tokens_impossible() -> None:
    g = log_softmax(np.array([1.0, -np.inf, 0.0, 2.0]))
    out = costeer(g, log_softmax(np.array([0.0, 3.0, 1.0, 0.0])), log_softmax(np.zeros(4)))
    assert np.isneginf(out[1]) and np.all(np.isfinite(out[[0, 2, 3]]))
    assert math.isclose(float(np.exp(out.astype(np.float64)).sum()), 1.0, rel_tol=1e-5)
    with pytest.raises(ValueError):
        costeer(g, np.zeros(3), np.zeros(3))


@given(logp_rows(3, max_len=30))
def test_light_costeer_beta_zero_is_generalist(rows: tuple) -> None:
    g, sc, s0 = rows
    np.testing.assert_array_equal(light_costeer(g, sc, s0, beta=0.0), g.astype(np.float32))
    np.testing.assert_allclose(light_costeer(g, sc, s0), g + sc - s0, atol=1e-5)


def test_nucleus_keeps_the_shortest_prefix_reaching_top_p() -> None:
    from specsteer.steer import nucleus

    best_first = np.log(np.array([0.6, 0.3, 0.05, 0.05], dtype=np.float64))
    assert nucleus(best_first, 0.5) == 1
    assert nucleus(best_first, 0.6) == 1
    assert nucleus(best_first, 0.61) == 2
    assert nucleus(best_first, 0.92) == 3
    assert nucleus(best_first, 0.99) == 4
    assert nucleus(best_first, 1.0) == 4
    assert nucleus(best_first[:1], 0.1) == 1


@given(logp_rows(2, max_len=200), st.floats(0.05, 1.0), st.floats(0.0, 2.0),
       st.integers(1, 80), st.booleans())
def test_steer_top_equals_sparse_steer_on_the_full_rows(rows: tuple, top_p: float, alpha: float,
                                                         k: int, s0_here: bool) -> None:
    """An engine that returns only the top-k of logp_G (vLLM) gets the same verdict."""
    from specsteer.steer import steer_top, top_k_ids

    g, s0 = rows
    ids = top_k_ids(g, k)
    full = sparse_steer(g, s0 if s0_here else None, alpha, k, top_p=top_p)
    top = steer_top(ids, g[ids], s0[ids] if s0_here else None, alpha, top_p)
    assert top == full


def test_classic_accept_best_matches_the_argmax_rule() -> None:
    from specsteer.steer import classic_accept_best

    rows = np.full((4, 10), -5.0)
    for i, best in enumerate([3, 4, 9, 1]):
        rows[i, best] = 0.0
    assert classic_accept_greedy([3, 4, 5], rows) == classic_accept_best([3, 4, 5], [3, 4, 9, 1])
    assert classic_accept_best([3, 4, 5], [3, 4, 9, 1]) == (2, 9)
    assert classic_accept_best([3, 4, 9], [3, 4, 9, 1]) == (3, 1)
    with pytest.raises(ValueError, match=r"K\+1"):
        classic_accept_best([3, 4], [3])


def test_sparse_steer_top_p_is_a_prefix_of_top_k() -> None:
    rng = np.random.default_rng(5)
    g = log_softmax(rng.normal(size=500) * 3)
    s0 = log_softmax(rng.normal(size=500))
    full = sparse_steer(g, s0, 1.0, 64)
    cut = sparse_steer(g, s0, 1.0, 64, top_p=0.9)
    n = len(cut.ids)
    assert 1 <= n < 64
    assert cut.ids.tolist() == full.ids.tolist()[:n]
    assert np.exp(g[cut.ids]).sum() >= 0.9 > np.exp(g[cut.ids[:-1]]).sum()


# ---------------------------------------------------------------- the first test from the opening


def _companion_accepts(logp_g: float, logp_s0: float, gamma: float) -> bool:
    """What the companion decides: its float32 logp_G against the float16 logp_S0 it received."""
    s0 = float(np.float16(logp_s0))
    return steer.ratio_accept_count(np.array([np.float32(logp_g)]), np.array([s0]), gamma) == 1


def test_first_ratio_test_answers_only_what_float16_cannot_change():
    rng = np.random.default_rng(7)
    settled = 0
    for _ in range(3000):
        gamma = float(rng.choice([0.05, 0.5, 0.9, 1.0]))
        logp_s0 = float(rng.uniform(-12, 0))
        # logp_G of the draft: near the boundary half of the time, where rounding matters
        boundary = float(np.float16(logp_s0)) + np.log(gamma)
        logp_g = float(np.float32(boundary + rng.normal(0, 0.01 if rng.random() < 0.5 else 2)))
        others = np.sort(rng.uniform(-20, 0, 8))[::-1]
        ids, values = [5, *range(10, 18)], [logp_g, *others]
        answer = steer.first_ratio_test(5, logp_s0, ids, np.float16(values), gamma)
        if answer is not None:
            settled += 1
            assert answer == _companion_accepts(logp_g, logp_s0, gamma), (logp_g, logp_s0, gamma)
    assert settled > 2000  # most are settled; only near-ties wait for the verdict


def test_first_ratio_test_of_an_id_outside_the_candidates():
    values = np.float16([-1.0, -2.0, -3.0])
    # its logp_G is at most the weakest candidate's: certain reject when even that fails
    assert steer.first_ratio_test(99, -1.0, [1, 2, 3], values, 0.5) is False
    # the weakest would pass: its own value is unknown, so the verdict decides
    assert steer.first_ratio_test(99, -6.0, [1, 2, 3], values, 0.5) is None
    assert steer.first_ratio_test(99, -6.0, [], [], 0.5) is None
    assert steer.first_ratio_test(99, -1.0, [1], [-1.0], 0.0) is True  # gamma 0 accepts all
    # below float16's range the candidate's value is -inf: logp_G < -65504, still settled
    assert steer.first_ratio_test(1, -3.0, [1], [-np.inf], 0.5) is False
