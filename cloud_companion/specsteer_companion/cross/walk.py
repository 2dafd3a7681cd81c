"""The walk: one model's next-token distribution re-expressed in another's vocabulary.

Given the Generalist's rows along a path of its tokens that spells a byte string q, `walk`
says how the Generalist's mass over what follows q falls on the Specialist's tokens (a
distribution, or the prefix marginal P_G(continuation starts with s)), with the per-pair tables
of `alignment`. Pure maths on numpy rows; no models, no state. See docs/cross-tokenizer.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specsteer_companion.cross.alignment import PairTables

__all__ = ["Walk", "walk"]


@dataclass(frozen=True)
class Walk:
    """The Generalist's view of what comes after a byte string, in the Specialist's vocabulary.

    probs: float64 [s.size], unnormalised: mode "token": mass of the next S token (each G
    continuation counted once, on its S image); mode "prefix": P_G(continuation starts with s).
    prefix: P_G(the text from the walk's base starts with q) — the normaliser of "prefix" mode,
    and the conditional denominator of the span test.
    end_weight: probability of reaching the end of q on a Generalist boundary (the weight of the
    last row's next-token distribution in `probs`); 0 if q ends inside every token.
    dropped: mass left unassigned (merge candidates past the cap, ends the walk cannot follow).
    uncertain: mass mapped through G tokens flagged by `PairTables.uncertain_g`.
    """

    probs: np.ndarray | None
    prefix: float
    end_weight: float
    dropped: float
    uncertain: float

    def logp(self, mode: str) -> np.ndarray:
        """log of the next-S-token distribution (token: renormalised; prefix: / self.prefix)."""
        assert self.probs is not None
        total = float(self.probs.sum()) if mode == "token" else self.prefix
        with np.errstate(divide="ignore"):
            return np.log(self.probs / total) if total > 0 else np.log(self.probs)


def walk(pair: PairTables, rows: Sequence[np.ndarray], path: Sequence[int], q: bytes, *,
         mode: str | None = "token", cap: int = 256, floor: float = 1e-7) -> Walk:
    """Marginalise the Generalist over its tokenizations of q, then look one token past q.

    rows[i] is the Generalist's log-prob row before path[i]; rows[len(path)] the one after the
    path. `path` is the Generalist's own tokenization of a prefix of q (its tokens end at or
    before len(q)); what q has beyond it is the remainder u. At each step the walk adds the
    Generalist tokens that start with the rest of q but leave the path ("merges": " hel" +
    "lo" written as " hello"); their bytes past q start the next S token. At the end of q the
    row after the path gives the next token directly; a merge that ends exactly at the end of
    q (another route to the same boundary) is continued with that same row, the closest
    history the walk has. This is the next-token-prefix marginal of Hayase et al. (arXiv
    2506.14123) restricted to the Generalist's path plus one token of divergence at every step:
    paths through other tokenizations, which a BPE model rarely produces, are left out.

    mode None computes only `prefix` (the span test); cap/floor bound the merges enumerated per
    step (the rest is counted in `dropped`).
    """
    if len(rows) != len(path) + 1:
        raise ValueError(f"need len(path)+1 rows, got {len(rows)} for {len(path)} tokens")
    probs = np.zeros(pair.s.size) if mode is not None else None
    prefix = dropped = uncertain = end_weight = 0.0
    at_end = 0.0  # mass of merges that end exactly where q ends
    w, rest = 1.0, q
    for i, lp in enumerate(rows):
        tok = path[i] if i < len(path) else None
        if not rest:  # at the end of q on a Generalist boundary: its next token, mapped
            end_weight = w + at_end
            prefix += w
            if probs is not None:
                p = np.exp(np.asarray(lp, dtype=np.float64))
                probs += end_weight * (pair.token_mass(p) if mode == "token"
                                       else pair.prefix_mass(p))
                uncertain += end_weight * float(p[pair.uncertain_g].sum())
            break
        ids = pair.g.cover(rest)
        if tok is not None:
            ids = ids[ids != tok]
        p = np.exp(np.asarray(lp, dtype=np.float64)[ids])
        prefix += w * float(p.sum())
        if probs is not None:
            lost, ending = _merges(pair, probs, ids, p, w, len(rest), mode, cap, floor)
            dropped += lost
            at_end += ending
        if tok is None:
            dropped += at_end  # q ends inside a token: no row to continue those merges with
            break
        piece = pair.g.pieces[tok]
        if not rest.startswith(piece):
            raise ValueError("path tokens must spell a prefix of q")
        w *= float(np.exp(np.float64(lp[tok])))
        rest = rest[len(piece):]
    return Walk(probs, prefix, end_weight, dropped, uncertain)


def _merges(pair: PairTables, probs: np.ndarray, ids: np.ndarray, p: np.ndarray, w: float,
            skip: int, mode: str, cap: int, floor: float) -> tuple[float, float]:
    """Add the merge tokens' mass onto the S tokens their bytes past q start.

    Returns (dropped, ending): mass not enumerated, and mass of tokens ending exactly at q's end.
    """
    if not ids.size:
        return 0.0, 0.0
    keep = np.flatnonzero(p * w >= floor)
    if keep.size > cap:
        keep = keep[np.argsort(-p[keep], kind="stable")[:cap]]
    dropped = w * (float(p.sum()) - float(p[keep].sum()))
    ending = 0.0
    for j in keep:
        tail = pair.g.pieces[int(ids[j])][skip:]
        if not tail:
            ending += w * float(p[j])
            continue
        if mode == "token":
            sid = pair.first_token(tail)
            if sid >= 0:
                probs[sid] += w * float(p[j])
        else:
            for n in range(1, min(len(tail), pair.s.max_len) + 1):
                sid = pair.s.by_piece.get(tail[:n])
                if sid is not None:
                    probs[sid] += w * float(p[j])
    return dropped, ending
