"""The decoding rules of SpecSteer and its baselines, as pure functions on numpy arrays.

This module owns the maths of docs/method.md: the ratio acceptance test (Verify), the sparse
steering vector and its fusion on the device (Recover), classic speculative acceptance
(greedy and Leviathan et al. sampling), LightCoSteer and CoSteer. The device, the companion and
the benchmark harness all call these same functions, so the two sides of the wire cannot drift.

It must not do I/O, hold state, load models or import anything but numpy: every input is an
array (a full vocabulary row [V] or a candidate sub-row [k]) and every random draw comes from a
caller-supplied `np.random.Generator`, so a run is reproducible from its seed.
Conventions: ties go to the lowest index; `-inf` means "impossible" and survives every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SELECTS = ("generalist", "difference")  # how the companion picks its candidates (sparse_steer)

__all__ = [
    "SELECTS",
    "RoundVerdict",
    "SparseSteer",
    "classic_accept_greedy",
    "classic_accept_sampling",
    "costeer",
    "fuse",
    "light_costeer",
    "log_softmax",
    "log_softmax_wide",
    "nucleus",
    "pick",
    "possible_only",
    "ratio_accept_count",
    "ratio_accepts",
    "sample_index",
    "sparse_steer",
    "token_logprobs",
    "top_k_ids",
]


# --------------------------------------------------------------------------- distributions


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Log-probabilities over the last axis, as float32.

    Subtracting the row maximum keeps huge logits finite; the arithmetic runs in the input's
    precision (at least float32) so float64 logits beyond float32's range still work.
    A temperature <= 0 means 1 here: greedy callers still want the true distribution.
    """
    return log_softmax_wide(logits, temperature).astype(np.float32, copy=False)


def log_softmax_wide(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """log_softmax in max(input, float32) precision; rows that are all -inf give NaN."""
    x = np.asarray(logits)
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        shifted = x - m
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def token_logprobs(logits: np.ndarray, ids: Sequence[int], temperature: float = 1.0) -> np.ndarray:
    """Log-prob of ids[i] under row i of logits [n, V]; shape [n], float32.

    This is how a verifier turns one forward pass over the draft into the K numbers the
    acceptance test compares.
    """
    z = np.asarray(logits)
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    if z.ndim != 2 or z.shape[0] != idx.shape[0]:
        raise ValueError(f"logits must be [n, V] with n == len(ids); got {z.shape}, {idx.shape[0]}")
    return log_softmax(z, temperature)[np.arange(idx.shape[0]), idx]


def sample_index(weights: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to non-negative `weights` (need not sum to 1).

    One uniform per draw (inverse CDF), so the random stream is easy to reason about; unlike
    `rng.choice` it tolerates float32 rounding in the weights and never returns a zero weight.
    """
    w = np.asarray(weights, dtype=np.float64)
    cdf = np.cumsum(w)
    total = cdf[-1] if cdf.size else 0.0
    if not total > 0 or not np.isfinite(total):
        raise ValueError("cannot sample: weights must be finite, non-negative and not all zero")
    i = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    if i >= w.shape[0]:  # u * total rounded up to total: take the last non-zero entry
        i = int(np.flatnonzero(w > 0)[-1])
    return i


def top_k_ids(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first, ties to the lowest index; int32.

    Deterministic tie-breaking keeps the device and the companion on the same candidate set.
    Uses a partition (O(V)) and sorts only the k winners, so a 151k-token row stays cheap.
    NaN counts as -inf.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = s.shape[0]
    k = max(0, min(int(k), n))
    if k == 0:
        return np.empty(0, dtype=np.int32)
    key = np.where(np.isnan(s), -np.inf, s)
    if k < n:
        threshold = np.partition(key, n - k)[n - k]
        above = np.flatnonzero(key > threshold)
        tied = np.flatnonzero(key == threshold)[: k - above.shape[0]]
        cand = np.concatenate([above, tied])
    else:
        cand = np.arange(n)
    order = np.lexsort((cand, -key[cand]))  # primary: score descending; then id ascending
    return cand[order].astype(np.int32)


# --------------------------------------------------------------------------- Verify


def ratio_accept_count(
    logp_g: np.ndarray,
    logp_s0: np.ndarray,
    gamma: float,
    rng: np.random.Generator | None = None,
) -> int:
    """Number of leading drafts that pass SpecSteer's ratio test P_G / P_S0 against gamma.

    Greedy (rng None): accept draft i iff P_G >= gamma * P_S0, i.e. exactly when the sampling
    rule would accept it with probability 1. The boundary is inclusive so that identical
    models (P_G == P_S0) accept every draft for any gamma <= 1, the consistency check of
    docs/style.md. Sampling: one uniform per draft drawn up front. Counting stops at the first
    reject. gamma == 0 accepts everything (and draws nothing).
    """
    g = np.asarray(logp_g, dtype=np.float64).reshape(-1)
    s0 = np.asarray(logp_s0, dtype=np.float64).reshape(-1)
    if g.shape != s0.shape:
        raise ValueError(f"logp_g and logp_s0 differ in length: {g.shape[0]} != {s0.shape[0]}")
    _check_gamma(gamma)
    if gamma == 0:
        return int(g.shape[0])
    u = None if rng is None else 1.0 - rng.random(g.shape[0])  # uniform on (0, 1]
    with np.errstate(invalid="ignore"):
        return _leading_true(_passes(g - s0, gamma, u))


def ratio_accepts(
    log_ratio: float,
    gamma: float,
    rng: np.random.Generator | None = None,
    slack: float = 0.0,
) -> bool:
    """The same test for one unit (a span of text, when the tokenizers differ).

    log_ratio is log P_G - log P_S0 of the unit. `slack` lets a greedy caller that sums its
    logs in different orders on the two sides still accept identical models at gamma 1.
    Sampling draws one uniform, and only when gamma > 0 (gamma 0 accepts and draws nothing).
    """
    _check_gamma(gamma)
    if gamma == 0:
        return True
    u = None if rng is None else np.array([1.0 - rng.random()])
    return bool(_passes(np.array([log_ratio], np.float64), gamma, u, slack)[0])


def first_ratio_test(
    draft_id: int,
    logp_s0: float,
    candidate_ids: Sequence[int],
    candidate_logp_g: Sequence[float],
    gamma: float,
) -> bool | None:
    """The greedy ratio test of a round's first drafted id, settled from its position's
    candidates alone (SessionOpened's: logp_G over the Generalist's top-k, float16 on the wire):
    True or False where the float16 rounding cannot change the companion's answer, None where
    it could, or where the id is not a candidate and the weakest candidate would pass (its own
    logp_G is then only known to be no higher). `logp_s0`: the value the device sends for it
    (float16, as the companion reads it)."""
    _check_gamma(gamma)
    if gamma == 0:
        return True
    values = np.asarray(candidate_logp_g, np.float64)
    if not values.size:
        return None
    s0 = float(np.float64(np.asarray(logp_s0, "<f2")))

    def bounds(value: float) -> tuple[float, float]:
        """Where the float32 logp_G behind a float16 `value` lies."""
        if np.isneginf(value):  # below float16's range
            return -math.inf, float(np.finfo(np.float16).min)
        error = abs(value) * 2.0**-10 + 2.0**-24  # over half a float16 step, subnormals too
        return value - error, value + error

    where = [i for i, c in enumerate(candidate_ids) if c == draft_id]
    if where:
        low, high = bounds(float(values[where[0]]))
    else:
        low, high = -math.inf, bounds(float(values.min()))[1]
    # the companion's own rule (`_passes`) at both ends of where logp_G may lie
    if _passes(np.array([low - s0]), gamma, None)[0]:
        return True
    if not _passes(np.array([high - s0]), gamma, None)[0]:
        return False
    return None


def _check_gamma(gamma: float) -> None:
    if not gamma >= 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")


def _passes(
    log_ratio: np.ndarray, gamma: float, u: np.ndarray | None, slack: float = 0.0
) -> np.ndarray:
    """The ratio rule, elementwise: P_G >= gamma P_S0 (greedy) or u <= P_G / (gamma P_S0).

    Runs on log P_G - log P_S0, which is exact for equal inputs at any magnitude; NaN (0/0)
    rejects. gamma must be > 0 here.
    """
    with np.errstate(invalid="ignore"):
        shifted = log_ratio - math.log(gamma)
        if u is None:
            return shifted >= -slack
        return np.log(u) <= shifted


def _leading_true(mask: np.ndarray) -> int:
    """Length of the run of True at the start of mask (first-reject semantics)."""
    rejects = np.flatnonzero(~mask)
    return int(rejects[0]) if rejects.size else int(mask.shape[0])


# --------------------------------------------------------------------------- Recover


@dataclass(frozen=True)
class SparseSteer:
    """The companion's verdict for the recovery / bonus position, as it travels.

    ids: int32 [k] candidate token ids; values: float16 [k] = logp_G - alpha * logp_S0 there.
    Holds nothing derived from the private context; the device adds alpha * logp_Sc itself.
    Arrays are coerced to the wire dtypes and made read-only so a frozen steer stays frozen.
    """

    ids: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        ids = np.array(self.ids, dtype=np.int32).reshape(-1)
        values = np.array(self.values, dtype=np.float16).reshape(-1)
        if ids.shape != values.shape:
            raise ValueError(f"ids and values differ in length: {ids.size} != {values.size}")
        if ids.size and ids.min() < 0:
            raise ValueError("token ids must be non-negative")
        if np.unique(ids).shape != ids.shape:
            raise ValueError("token ids must be distinct")
        ids.setflags(write=False)
        values.setflags(write=False)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)

    def __eq__(self, other: object) -> bool:
        """Equal when the same ids carry bit-identical fp16 values, in the same order."""
        if not isinstance(other, SparseSteer):
            return NotImplemented
        same_ids = np.array_equal(self.ids, other.ids)
        return same_ids and self.values.tobytes() == other.values.tobytes()

    def __hash__(self) -> int:
        """Hash of the wire bytes, consistent with __eq__."""
        return hash((self.ids.tobytes(), self.values.tobytes()))


def _steer_values(logp_g: np.ndarray, logp_s0: np.ndarray, alpha: float) -> np.ndarray:
    """logp_G - alpha * logp_S0 in float64; alpha 0 ignores S0 (no 0 * -inf), P_G = 0 stays -inf."""
    g = np.asarray(logp_g, dtype=np.float64)
    if alpha == 0:
        return g.copy()
    with np.errstate(invalid="ignore"):
        out = g - alpha * np.asarray(logp_s0, dtype=np.float64)
    out[np.isneginf(g) | np.isnan(out)] = -np.inf
    return out


def sparse_steer(
    logp_g_row: np.ndarray,
    logp_s0_row: np.ndarray | None,
    alpha: float,
    top_k: int,
    select: str = "generalist",
    top_p: float = 1.0,
) -> SparseSteer:
    """The sparse vector the companion sends down for the recovery / bonus position.

    Candidates: the top-k of logp_G (select="generalist", the default: docs/method.md measured that
    the top-k of the difference favours tokens the Specialist merely finds unlikely, often
    end-of-text) or of logp_G - alpha * logp_S0 (select="difference", kept for comparison);
    top_p < 1 keeps only the shortest prefix of them holding top_p of P_G's mass (`nucleus`).
    Values: logp_G - alpha * logp_S0 there, rounded to float16 because that is what travels.
    logp_s0_row None means P_S0 lives on the device, which subtracts it when it fuses: the
    values are logp_G and the candidates always the Generalist's (the device cannot rank by a
    difference it has not been sent).
    """
    g = np.asarray(logp_g_row).reshape(-1)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if select not in SELECTS:
        raise ValueError(f"select must be 'generalist' or 'difference', got {select!r}")
    if logp_s0_row is not None:
        s0 = np.asarray(logp_s0_row).reshape(-1)
        if g.shape != s0.shape:
            raise ValueError(f"rows differ in length: {g.shape[0]} != {s0.shape[0]}")
    if select == "difference" and logp_s0_row is not None:
        diff = _steer_values(g, s0, alpha)
        ids = top_k_ids(diff, top_k)
        return SparseSteer(ids=ids, values=diff[ids].astype(np.float16))
    ids = top_k_ids(g, top_k)  # values only at the winners: O(V) once
    return steer_top(ids, g[ids], None if logp_s0_row is None else s0[ids], alpha, top_p)


def steer_top(
    ids_best_first: np.ndarray,
    logp_g_top: np.ndarray,
    logp_s0_top: np.ndarray | None,
    alpha: float,
    top_p: float = 1.0,
) -> SparseSteer:
    """`sparse_steer` (select="generalist") from the Generalist's top-k alone.

    For an engine that returns the top-k of logp_G rather than whole rows (vLLM): `ids_best_first`
    and `logp_g_top` are its top-k, best first; `logp_s0_top` is logp_S0 at those ids (None when
    P_S0 lives on the device). Same candidates and values as `sparse_steer` on the full rows.
    """
    ids = np.asarray(ids_best_first, dtype=np.int32).reshape(-1)
    g = np.asarray(logp_g_top, dtype=np.float64).reshape(-1)
    keep = nucleus(g, top_p)
    if logp_s0_top is None:
        return SparseSteer(ids=ids[:keep], values=g[:keep].astype(np.float16))
    s0 = np.asarray(logp_s0_top, dtype=np.float64).reshape(-1)
    values = _steer_values(g[:keep], s0[:keep], alpha)
    return SparseSteer(ids=ids[:keep], values=values.astype(np.float16))


def nucleus(logp_best_first: np.ndarray, top_p: float) -> int:
    """How many of the best-first candidates (their logp) make the shortest prefix reaching top_p.

    At least one is kept; top_p >= 1 keeps them all (the exact top-k of the method).
    """
    n = int(np.asarray(logp_best_first).shape[0])
    if top_p >= 1.0 or n <= 1:
        return n
    mass = np.cumsum(np.exp(np.asarray(logp_best_first, dtype=np.float64)))
    keep = int(np.searchsorted(mass, top_p, side="left")) + 1
    return max(1, min(keep, n))


def possible_only(steer: SparseSteer) -> SparseSteer:
    """The candidates with a finite value (at least the first, so that something is sent).

    Needed where the Generalist's row is mapped onto another vocabulary and may leave tokens
    with no mass at all (docs/cross-tokenizer.md).
    """
    keep = np.isfinite(steer.values.astype(np.float32))
    if not keep.any():
        keep[:1] = True
    return SparseSteer(steer.ids[keep], steer.values[keep])


@dataclass(frozen=True)
class RoundVerdict:
    """What one verification round decides, before it is encoded for the wire.

    accepted: leading drafts that stand; candidates: the sparse vector for the position after
    them (a single id with value 0 in classic speculative decoding: the correction or bonus);
    s0_values: logp_S0 at the candidates, for the per-token baselines (ROWS mode) only.
    """

    accepted: int
    candidates: SparseSteer
    s0_values: np.ndarray | None = None


def fuse(
    steer: SparseSteer,
    logp_sc_row: np.ndarray,
    alpha: float,
    logp_s0_row: np.ndarray | None = None,
) -> np.ndarray:
    """Device-side scores over steer.ids: values + alpha * logp_Sc[ids], float32.

    This is where the private term enters, on the device only. Rows are full log-probability
    rows indexed by token id. With `logp_s0_row` (P_S0 placed on the device, so the values are
    plain logp_G) the context-free term is subtracted here: values + alpha * (logp_Sc - logp_S0).
    NaN (e.g. +inf + -inf) becomes -inf: never pickable.
    """
    base = steer.values.astype(np.float32)
    if alpha == 0:
        return base
    private = np.asarray(logp_sc_row, dtype=np.float32).reshape(-1)[steer.ids]
    with np.errstate(invalid="ignore"):
        if logp_s0_row is not None:
            private = private - np.asarray(logp_s0_row, dtype=np.float32).reshape(-1)[steer.ids]
        scores = base + np.float32(alpha) * private
    scores[np.isnan(scores)] = -np.inf
    return scores


def pick(
    ids: np.ndarray,
    scores: np.ndarray,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
) -> int:
    """Choose one token id from a candidate set by its scores.

    temperature 0: argmax, ties to the first candidate (ids come best-first, so that is the
    Generalist's preference). Otherwise sample from softmax(scores / temperature) with rng.
    """
    ids_arr = np.asarray(ids).reshape(-1)
    s = np.asarray(scores).reshape(-1)
    if ids_arr.shape != s.shape or ids_arr.size == 0:
        raise ValueError(f"need equal, non-empty ids and scores; got {ids_arr.shape}, {s.shape}")
    if temperature <= 0:
        return int(ids_arr[int(np.argmax(np.where(np.isnan(s), -np.inf, s)))])
    if rng is None:
        raise ValueError("sampling (temperature > 0) needs an rng")
    p = np.exp(log_softmax_wide(s.astype(np.float64), temperature))
    return int(ids_arr[sample_index(np.nan_to_num(p, nan=0.0), rng)])


# --------------------------------------------------------------------------- baselines


def classic_accept_greedy(draft: Sequence[int], logits_g: np.ndarray) -> tuple[int, int]:
    """Standard greedy speculative decoding: accept while draft[i] == argmax of row i.

    logits_g [K+1, V] are the verifier's rows for the K draft positions and the one after.
    Returns (n_accepted, next_token): the correction at the first mismatch or the bonus token.
    """
    d = np.asarray(draft, dtype=np.int64).reshape(-1)
    z = np.asarray(logits_g)
    if z.ndim != 2 or z.shape[0] != d.shape[0] + 1:
        raise ValueError(f"logits_g must be [K+1, V] for K={d.shape[0]} drafts; got {z.shape}")
    return classic_accept_best(d, np.argmax(z, axis=-1))


def classic_accept_best(draft: Sequence[int], best: Sequence[int]) -> tuple[int, int]:
    """`classic_accept_greedy` from the verifier's argmax at each of the K+1 rows."""
    d = np.asarray(draft, dtype=np.int64).reshape(-1)
    b = np.asarray(best, dtype=np.int64).reshape(-1)
    if b.shape[0] != d.shape[0] + 1:
        raise ValueError(f"need K+1 = {d.shape[0] + 1} argmax ids, got {b.shape[0]}")
    n = _leading_true(b[:-1] == d)
    return n, int(b[n])


def classic_accept_sampling(
    draft: Sequence[int],
    p_draft: np.ndarray,
    p_target: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Leviathan et al. speculative sampling: the emitted tokens are distributed as p_target.

    p_draft [K, V]: drafter probabilities the drafts were sampled from; p_target [K+1, V].
    Draft i is accepted w.p. min(1, p/q); on the first reject the replacement is drawn from
    normalize(max(0, p - q)) (p itself if that is all zero from rounding); if all K pass, a
    bonus is drawn from p_target[K]. Returns (n_accepted, next_token).
    """
    d = np.asarray(draft, dtype=np.int64).reshape(-1)
    q = np.asarray(p_draft, dtype=np.float64)
    p = np.asarray(p_target, dtype=np.float64)
    k = d.shape[0]
    if q.ndim != 2 or p.ndim != 2 or q.shape[0] != k or p.shape != (k + 1, q.shape[1]):
        raise ValueError(
            f"need p_draft [K, V] and p_target [K+1, V] for K={k}; got {q.shape}, {p.shape}"
        )
    for i in range(k):
        p_i, q_i = p[i, d[i]], q[i, d[i]]
        if rng.random() * q_i < p_i:  # u < p/q without dividing; q == p == 0 rejects
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        return i, sample_index(residual if residual.sum() > 0 else p[i], rng)
    return k, sample_index(p[k], rng)


def _delta(logp_sc: np.ndarray, logp_s0: np.ndarray) -> np.ndarray:
    """Context shift logp_Sc - logp_S0 in float64; tokens both variants rule out get 0, not NaN."""
    with np.errstate(invalid="ignore"):
        d = np.asarray(logp_sc, dtype=np.float64) - np.asarray(logp_s0, dtype=np.float64)
    d[np.isnan(d)] = 0.0
    return d


def light_costeer(
    logp_g_row: np.ndarray,
    logp_sc_row: np.ndarray,
    logp_s0_row: np.ndarray,
    beta: float = 1.0,
) -> np.ndarray:
    """LightCoSteer scores logp_G + beta * (logp_Sc - logp_S0), float32; the caller argmaxes.

    One fused step per token; beta 0 returns logp_G exactly.
    """
    g = np.asarray(logp_g_row, dtype=np.float64)
    if beta == 0:
        return g.astype(np.float32)
    return (g + beta * _delta(logp_sc_row, logp_s0_row)).astype(np.float32)


def costeer(
    logp_g_row: np.ndarray,
    logp_sc_row: np.ndarray,
    logp_s0_row: np.ndarray,
    *,
    iterations: int = 20,
    a: float = 2.0,
    beta: float = 1.0,
    lam: float = 2.0,
    eta: float = 10.0,
) -> np.ndarray:
    """CoSteer's online FTRL loop (docs/method.md, verbatim); returns the final log-distribution pi.

        pi0 = logp_G; delta = logp_Sc - logp_S0; pi = pi0; U = 0
        for t in 1..T: U += a*(pi - pi0) + beta*delta
                       pi = log_softmax((t*lam*pi0 + U + pi/eta) / (t*lam + 1/eta))

    On a candidate sub-row, log_softmax renormalises over the candidates (how the harness runs
    it). Tokens with logp_G = -inf stay at -inf; the loop runs on the Generalist's support so
    -inf - -inf never poisons U. iterations 0 returns log_softmax(logp_G). Result is float32.
    """
    pi0_full = np.asarray(logp_g_row, dtype=np.float64).reshape(-1)
    delta_full = _delta(logp_sc_row, logp_s0_row).reshape(-1)
    if delta_full.shape != pi0_full.shape:
        raise ValueError(f"rows differ in length: {pi0_full.shape[0]} != {delta_full.shape[0]}")
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    support = ~np.isneginf(pi0_full)
    if not support.any():
        raise ValueError("logp_g_row gives every token probability 0")
    pi0, delta = pi0_full[support], delta_full[support]
    pi = log_softmax_wide(pi0) if iterations == 0 else pi0
    u = np.zeros_like(pi0)
    for t in range(1, iterations + 1):
        u = u + a * (pi - pi0) + beta * delta
        pi = log_softmax_wide((t * lam * pi0 + u + pi / eta) / (t * lam + 1.0 / eta))
    out = np.full(pi0_full.shape, -np.inf, dtype=np.float32)
    out[support] = pi
    return out
