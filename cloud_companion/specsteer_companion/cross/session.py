"""Verification across tokenizers: the companion reads the Specialist's draft as text.

`Verifier.open` uses `CrossVerifierSession` when the Generalist's tokenizer differs from the
Specialist's (by vocabulary hash, never by name). The wire protocol is unchanged: the device
sends Specialist token ids and gets Specialist token ids back. Per round the session decodes the
committed text and the draft to bytes, lets the Generalist tokenize them its own way, and
  - verifies on spans between boundaries both tokenizations share (and that more text cannot
    move): P_G(span) against gamma * P_S0(span), each the product of its own tokens' probabilities;
    the last span, which ends inside the Generalist's last, unfinished pre-token, is tested with
    the prefix marginal P_G(continuation starts with these bytes) (tail="marginal") or left for
    the next round (tail="backoff");
  - recovers in the Specialist's vocabulary: the Generalist's next-token distribution at the
    recovery point, re-expressed over Specialist tokens by `walk.walk`, top-k of that, and
    values `logp_G_mapped - alpha * logp_S0` over those Specialist ids, so the device fuses
    with `alpha * logp_Sc` exactly as with one tokenizer.
Like `VerifierSession` it sees the public prompt and the generated text only, never the
private context. See docs/cross-tokenizer.md for the design and its measured approximations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specsteer import steer
from specsteer.protocol import Mode, OpenSession
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer_companion.cross.alignment import (
    PairTables,
    common_boundaries,
    encode_bytes,
    ends_of,
    pair_tables,
    settle,
    utf8_complete,
)
from specsteer_companion.cross.prompts import generalist_prompt
from specsteer_companion.cross.walk import walk

TAILS = ("marginal", "backoff")
RECOVERIES = ("token", "prefix")
_KEEP_ROWS = 48  # Generalist rows kept behind the cache end (a span or a healing walk reaches back)
_LOOKAHEAD_MIN = 0.01  # smallest mass worth a lookahead step
_ROUNDING = 1e-9  # log-ratio slack of the greedy test: identical models must pass at gamma = 1


@dataclass
class CrossStats:
    """Counters of one session: how verification split into spans, and recovery's coverage."""

    rounds: int = 0
    spans: int = 0  # spans tested
    spans_accepted: int = 0
    tail_spans: int = 0  # spans tested with the prefix marginal (they end in unsettled text)
    recoveries: int = 0
    uncertain: float = 0.0  # sum over recoveries of the mass share flagged `uncertain_g`
    dropped: float = 0.0  # sum over recoveries of the mass share left unassigned
    moved: float = 0.0  # sum over recoveries of the mass share lookahead steps re-assigned
    examined: float = 0.0  # sum over recoveries of the flagged mass share lookahead examined
    lookahead_steps: int = 0
    g_tokens: int = 0  # Generalist tokens run (re-runs after a re-tokenization included)
    recovery_passes: int = 0  # recoveries that ran the Generalist on their own path
    retokenized: int = 0  # cached Generalist tokens dropped because the tokenization changed

    @property
    def coverage(self) -> float:
        """Mean share of the recovery mass the walk assigned to a Specialist token.

        `uncertain` bounds how much of it may sit on too short a token; lookahead steps
        measure the part that actually does (`moved`, docs/cross-tokenizer.md).
        """
        if not self.recoveries:
            return 1.0
        return 1.0 - self.dropped / self.recoveries


@dataclass(frozen=True)
class SpanCheck:
    """One span test of the last round: bytes [start, end) of the generated text."""

    start: int
    end: int
    marginal: bool  # tested with the prefix marginal (ends in unsettled text)
    log_ratio: float  # log P_G - log P_S0 of its drafted part (NaN in SPECULATIVE mode)
    accepted: bool


@dataclass
class _View:
    """The Generalist's reading of the generated text plus the draft."""

    full: bytes  # generated text + draft text
    ids: list[int]  # Generalist tokens spelling full[:ends[-1]] (at most full[:complete])
    ends: np.ndarray  # byte end of each of ids
    complete: int  # length of the text without an unfinished UTF-8 character at its end
    settled: int  # boundaries at or before this offset stay whatever text follows

    def tokens_upto(self, pos: int) -> int:
        """Number of tokens that end at or before byte `pos`."""
        return int(np.searchsorted(self.ends, pos, side="right"))


@dataclass(frozen=True)
class ScoredText:
    """A draft whose text the Generalist has read, waiting for its span tests (`decide`)."""

    words: list[int]  # the draft up to its end-of-text
    eos_at: int | None
    d0: int  # byte offset of the draft in the text
    d_ends: np.ndarray  # byte end of every drafted word
    seq: list[int]  # the committed ids, then the draft
    offset: int  # where the draft starts in `seq`
    view: _View

    @property
    def draft(self) -> list[int]:
        return self.seq[self.offset :]


class _GTrack:
    """The Generalist's KV session: the public prompt, then its own tokenization of the text.

    `sync` makes the cache hold a new tokenization by keeping the common prefix (usually all of
    the old one) and appending the rest in one pass; rows[j] is the log-prob row before
    generated token j, kept for the last `_KEEP_ROWS` positions and rebuilt when a walk needs
    an older one.
    """

    def __init__(self, model: LanguageModel, prompt: Sequence[int], max_tokens: int,
                 logp: Callable[[np.ndarray], np.ndarray], stats: CrossStats) -> None:
        self.track = Track(model, prompt, max_tokens)
        self.session = self.track.session
        self.prompt = list(prompt)
        self.ids: list[int] = []
        self._logp = logp
        self._rows: dict[int, np.ndarray] = {0: logp(self.track.row[None, :])[0]}
        self.stats = stats

    def sync(self, ids: Sequence[int]) -> int:
        """Hold exactly `ids` after the prompt; returns how many tokens had to be run."""
        k = 0
        while k < min(len(self.ids), len(ids)) and self.ids[k] == ids[k]:
            k += 1
        if k < len(self.ids):
            self.stats.retokenized += len(self.ids) - k
            self._truncate(k)
        if k < len(ids):
            self._extend(list(ids[k:]))
        return len(ids) - k

    def _truncate(self, n: int) -> None:
        self.session.rewind(len(self.prompt) + n)
        del self.ids[n:]
        for j in [j for j in self._rows if j > n]:
            del self._rows[j]

    def _extend(self, new: list[int]) -> None:
        n = len(self.ids)
        if n in self._rows:
            out = self.session.append(new)
            first = n + 1
        else:  # the row before the first new token was pruned: re-run the token before it
            prev = self.ids[n - 1] if n > 0 else self.prompt[-1]
            self.session.rewind(len(self.prompt) + n - 1)
            out = self.session.append([prev, *new])
            first = n
        self.stats.g_tokens += len(out)
        for i, row in enumerate(self._logp(out)):
            self._rows[first + i] = row
        self.ids.extend(new)

    def rows(self, j0: int, j1: int) -> list[np.ndarray]:
        """Rows j0..j1 inclusive (j1 <= len(ids)), rebuilt from j0 if any was pruned."""
        if any(j not in self._rows for j in range(j0, j1 + 1)):
            tail = self.ids[j0:]
            self._truncate(j0)
            self._rows.pop(j0, None)  # force _extend to re-run the token before j0
            self._extend(tail)
        return [self._rows[j] for j in range(j0, j1 + 1)]

    def prune(self) -> None:
        floor = len(self.ids) - _KEEP_ROWS
        for j in [j for j in self._rows if j < floor]:
            del self._rows[j]

    def close(self) -> None:
        self.track.close()


class HostedModels(Protocol):
    """What a session needs of the companion's `Verifier` (no import of it: no cycle)."""

    generalist: LanguageModel
    specialist: LanguageModel | None
    max_session_tokens: int


class CrossVerifierSession:
    """One device's generation on the companion when the two tokenizers differ.

    tail: "marginal" (test the span that ends in unsettled text with the prefix marginal) or
    "backoff" (leave it for the next round). recovery: "token" (the Generalist's mass on each
    next Specialist token, a distribution) or "prefix" (P_G(continuation starts with s), the
    next-token-prefix marginal; overlapping events, so short tokens score at least as high as
    their extensions). heal: recover from one Generalist token back, so that continuations
    which would merge with the last token ("hel" + "lo" = "hello") keep their mass.
    in_context: tokenize the unsettled end of the text the way that agrees with the draft
    (see `_view`); False keeps the Generalist's plain tokenization of the cut-off text.
    lookahead: Generalist steps per recovery spent resolving the most probable tokens whose
    Specialist image may be too short (`_look_ahead`); 0 keeps the one-step mapping.
    """

    def __init__(self, verifier: HostedModels, request: OpenSession, *,
                 committed: Sequence[int] = (), tail: str = "marginal",
                 recovery: str = "token", heal: bool = True, in_context: bool = True,
                 lookahead: int = 0, merge_cap: int = 256) -> None:
        if tail not in TAILS or recovery not in RECOVERIES:
            raise ValueError(f"tail must be one of {TAILS}, recovery one of {RECOVERIES}")
        if verifier.specialist is None:
            raise ValueError("cross-tokenizer verification needs the Specialist's tokenizer: "
                             "host the generic Specialist on the companion")
        self.request = request
        self.settings = settings = request.settings
        self.mode = Mode(settings.mode)
        self.tail, self.recovery, self.heal, self.merge_cap = tail, recovery, heal, merge_cap
        self.in_context, self.lookahead = in_context, lookahead
        self.temperature = settings.temperature if settings.temperature > 0 else 1.0
        self.rng = np.random.default_rng(settings.seed) if settings.temperature > 0 else None
        s_model, g_model = verifier.specialist, verifier.generalist
        self.pair: PairTables = pair_tables(s_model.tokenizer, g_model.tokenizer,
                                            s_model.vocab_size, g_model.vocab_size)
        self.stats = CrossStats()
        prompt = list(request.prompt_ids)
        g_prompt = generalist_prompt(self.pair.s, g_model.tokenizer, prompt)
        self.g = _GTrack(g_model, g_prompt, verifier.max_session_tokens, self._logp, self.stats)
        held = [*prompt, *committed]  # a resumed session: the committed text follows at once
        self.s0 = Track(s_model, held, verifier.max_session_tokens) \
            if settings.companion_s0 else None
        self.length = len(held)  # Specialist tokens held by the S0 cache
        self.text = bytearray()  # generated text, as committed by the device
        self.s_ends: list[int] = []  # byte end of every generated Specialist token
        self.last_spans: list[SpanCheck] = []  # the span tests of the last round (diagnostics)
        self._append(committed)  # the Generalist reads it with the next round's text

    def _logp(self, rows: np.ndarray) -> np.ndarray:
        return steer.log_softmax(rows, self.temperature)

    # ------------------------------------------------------------------------ rounds

    def verify(self, committed: Sequence[int], draft: Sequence[int],
               logp_s0_draft: Sequence[float] | None = None) -> steer.RoundVerdict:
        """One Draft–Verify–Recover round over text (SPECULATIVE: greedy-match spans)."""
        return self.decide(self.score(committed, draft), logp_s0_draft)

    def opening_candidates(self) -> None:
        """None: across tokenizers a verdict's candidates come from the text path's rows,
        which the first round builds (`VerifierSession.opening_candidates`)."""
        return None

    def score(self, committed: Sequence[int], draft: Sequence[int]) -> ScoredText:
        """A round's first half: the text with the draft, the Generalist synced over it."""
        self.stats.rounds += 1
        self._append(committed)
        draft = list(draft)
        eos_at = next((i for i, t in enumerate(draft) if t in self.pair.s_eos), None)
        words = draft[:eos_at] if eos_at is not None else draft
        d0 = len(self.text)
        d_ends = d0 + np.cumsum(self.pair.s.lengths[np.asarray(words, np.int64)]) \
            if words else np.zeros(0, np.int64)
        full = bytes(self.text) + self.pair.s.bytes_of(words)
        s_bounds = np.concatenate([np.asarray(self.s_ends, np.int64), d_ends])
        view = self._view(full, final=eos_at is not None, s_bounds=s_bounds)
        self.g.sync(view.ids)
        return ScoredText(words, eos_at, d0, d_ends, [*committed, *draft], len(committed), view)

    def decide(self, scored: ScoredText, logp_s0_draft: Sequence[float] | None = None
               ) -> steer.RoundVerdict:
        """A round's second half: the span tests with P_S0 (hosted here, or `logp_s0_draft`
        from the device), the candidates, and the kept text."""
        draft, words, offset, view = scored.draft, scored.words, scored.offset, scored.view
        s0_rows = logp_s0 = None
        if self.s0 is not None:
            s0_rows = self.s0.extend(scored.seq)
            logp_s0 = self._logp(s0_rows)
            ls0 = np.asarray([logp_s0[offset + i, t] for i, t in enumerate(draft)], np.float64)
        elif self.mode is Mode.SPECSTEER:
            ls0 = np.asarray(logp_s0_draft, np.float64)
        else:
            ls0 = np.zeros(len(draft))
        accepted, pos = self._accept(view, scored.d0, scored.d_ends, ls0, scored.eos_at)
        logp_hat = self._mapped(view, pos)
        at = offset + accepted
        if self.mode is Mode.SPECULATIVE:
            candidates = steer.SparseSteer([int(np.argmax(logp_hat))], [0.0])
        else:
            candidates = steer.possible_only(steer.sparse_steer(
                logp_hat, None if logp_s0 is None else logp_s0[at], self.settings.alpha,
                self.settings.top_k, self.settings.select,
                self.settings.top_p))
        result = steer.RoundVerdict(accepted, candidates)
        self._append(words[:accepted])
        self.length += at
        if self.s0 is not None and s0_rows is not None:
            self.s0.keep(self.length, s0_rows[at])
        self.g.prune()
        return result

    def row(self, committed: Sequence[int]) -> steer.RoundVerdict:
        """ROWS mode: top-k of the mapped logp_G at the end of the text, with logp_S0 there."""
        self._append(committed)
        view = self._view(bytes(self.text), final=False,
                          s_bounds=np.asarray(self.s_ends, np.int64))
        self.g.sync(view.ids)
        logp_hat = self._mapped(view, len(self.text))
        candidates = steer.possible_only(steer.sparse_steer(
            logp_hat, None, 0.0, self.settings.top_k, top_p=self.settings.top_p))
        top = candidates.ids
        s0_values = np.zeros(len(top), np.float16)
        if self.s0 is not None:
            s0_rows = self.s0.extend(list(committed))
            s0_values = self._logp(s0_rows[-1])[top].astype(np.float16)
            self.length += len(committed)
            self.s0.keep(self.length, s0_rows[-1])
        self.g.prune()
        return steer.RoundVerdict(0, candidates, s0_values)

    def close(self) -> None:
        self.g.close()
        if self.s0 is not None:
            self.s0.close()

    # ------------------------------------------------------------------------ text

    def _append(self, ids: Sequence[int]) -> None:
        """Commit Specialist tokens to the text (end-of-text adds no bytes)."""
        for t in ids:
            if t not in self.pair.s_eos:
                self.text += self.pair.s.pieces[t]
                self.s_ends.append(len(self.text))

    def _view(self, full: bytes, *, final: bool, s_bounds: np.ndarray | None = None) -> _View:
        """The Generalist's tokenization of `full` and how much of it is settled.

        final: the text ends here (a drafted end-of-text), so even its last token is settled.
        Otherwise the unsettled end is tokenized the way that shares most boundaries with the
        Specialist's tokens `s_bounds` among the in-context alternatives (`alignment.settle`):
        at the end of a text "\\n\\n" is one token, in context two, and a marginal along the
        wrong split misses most of the mass. A tokenizer that normalises (Qwen's NFC) can
        spell a token differently from the text; nothing past the first difference is trusted.
        """
        g = self.pair.g
        complete = utf8_complete(full)
        ids = encode_bytes(g, full[:complete])
        ends = ends_of(g, ids)
        spelled = g.bytes_of(ids)
        if spelled != full[:complete]:  # keep only the tokens before the first difference
            bad = next((i for i, (x, y) in enumerate(zip(spelled, full, strict=False)) if x != y),
                       min(len(spelled), complete))
            n = int(np.searchsorted(ends, bad, side="right"))
            ids, ends = ids[:n], ends[:n]
            complete = int(ends[-1]) if n else 0
            final = False
        if final and complete == len(full):
            return _View(full, ids, ends, complete, complete)
        settled, alternatives = settle(g, full[:complete], ids)
        if self.in_context and s_bounds is not None and alternatives:
            tail = s_bounds[(s_bounds > settled) & (s_bounds <= complete)]

            def shared(candidate: np.ndarray) -> int:
                return int(np.isin(candidate[candidate > settled], tail).sum())

            best = shared(ends)
            for alt in alternatives:
                alt_ends = ends_of(g, alt)
                if g.bytes_of(alt) == full[: int(alt_ends[-1]) if len(alt) else 0] \
                        and shared(alt_ends) > best:
                    ids, ends, best = alt, alt_ends, shared(alt_ends)
        return _View(full, ids, ends, complete, settled)

    # ------------------------------------------------------------------------ verify

    def _accept(self, view: _View, d0: int, d_ends: np.ndarray, ls0: np.ndarray,
                eos_at: int | None) -> tuple[int, int]:
        """Accepted draft count and the byte offset the recovery starts from."""
        s_bounds = np.concatenate([np.asarray(self.s_ends, np.int64), d_ends])
        common = common_boundaries(s_bounds, view.ends, view.settled)
        before = common[common <= d0]
        start = int(before[-1]) if before.size else 0
        spans: list[tuple[int, int, bool]] = []  # (from, to, tested by prefix marginal)
        for c in common[common > d0]:
            spans.append((start, int(c), False))
            start = int(c)
        reach = d_ends[d_ends <= view.complete]
        end = int(reach[-1]) if reach.size else d0
        if self.tail == "marginal" and end > start:
            spans.append((start, end, True))
        self.last_spans = []
        reached = d0
        for a, b, marginal in spans:
            if self.mode is Mode.SPECULATIVE:
                log_ratio, ok = math.nan, self._greedy_path(view, a, b, marginal)
            else:
                log_ratio = self._span_log_ratio(view, a, b, d0, d_ends, ls0, marginal)
                ok = self._passes(log_ratio)
            self.last_spans.append(SpanCheck(a, b, marginal, log_ratio, ok))
            self.stats.spans += 1
            self.stats.tail_spans += marginal
            if not ok:
                break
            self.stats.spans_accepted += 1
            reached = b
        accepted = int(np.searchsorted(d_ends, reached, side="right"))
        pos = int(d_ends[accepted - 1]) if accepted else d0
        if eos_at is not None and accepted == len(d_ends) and pos == len(view.full) \
                and view.complete == len(view.full) and view.settled == view.complete:
            row = self.g.rows(len(view.ids), len(view.ids))[0]
            lg = float(np.logaddexp.reduce(row[self.pair.g_eos].astype(np.float64))) \
                if self.pair.g_eos.size else -math.inf
            if self.mode is Mode.SPECULATIVE:
                ok = int(np.argmax(row)) in set(self.pair.g_eos.tolist())
            else:
                ok = self._passes(lg - float(ls0[eos_at]))
            accepted += ok
        return accepted, pos

    def _span_log_ratio(self, view: _View, a: int, b: int, d0: int, d_ends: np.ndarray,
                        ls0: np.ndarray, marginal: bool) -> float:
        """log P_G - log P_S0 of the drafted part of span [a, b) (conditioned on what precedes)."""
        if marginal:
            lg = self._log_prefix(view, a, b)
        else:
            ja, jb = view.tokens_upto(a), view.tokens_upto(b)
            rows = self.g.rows(ja, jb - 1)
            lg = float(sum(np.float64(r[t]) for r, t in zip(rows, view.ids[ja:jb], strict=True)))
        if a < d0:  # the span starts in committed text: condition on it
            lg -= self._log_prefix(view, a, d0)
        starts = np.concatenate([[d0], d_ends[:-1]])
        mine = (starts >= a) & (d_ends <= b)
        return lg - float(ls0[: len(d_ends)][mine].sum())

    def _greedy_path(self, view: _View, a: int, b: int, marginal: bool) -> bool:
        """SPECULATIVE: the span is the Generalist's own greedy text (settled spans only)."""
        ja, jb = view.tokens_upto(a), view.tokens_upto(b)
        if marginal or jb <= ja:
            return False
        rows = self.g.rows(ja, jb - 1)
        return all(int(np.argmax(r)) == t for r, t in zip(rows, view.ids[ja:jb], strict=True))

    def _passes(self, log_ratio: float) -> bool:
        """The method's ratio test on one span; the two sides sum their logs in different
        orders, so the greedy test allows rounding."""
        return steer.ratio_accepts(log_ratio, self.settings.gamma, self.rng, slack=_ROUNDING)

    def _log_prefix(self, view: _View, a: int, b: int) -> float:
        """log P_G(the text from boundary a starts with full[a:b]), along the cached path."""
        ja, jp = view.tokens_upto(a), view.tokens_upto(b)
        mass = walk(self.pair, self.g.rows(ja, jp), view.ids[ja:jp], view.full[a:b],
                    mode=None).prefix
        return math.log(mass) if mass > 0 else -math.inf

    # ------------------------------------------------------------------------ recover

    def _mapped(self, view: _View, pos: int) -> np.ndarray:
        """The Generalist's next-token distribution at byte `pos`, over Specialist ids (log).

        The walk starts at the last settled boundary before `pos` (one token back: healing)
        and follows a path that ends exactly at `pos` (`_recovery_path`), so that the row after
        it is the Generalist's next-token row at the recovery point. The Generalist's cache is
        moved onto that path; it costs a pass only when the draft had tokenized `pos` away.
        """
        limit = min(pos, view.settled)
        bounds = view.ends[view.ends <= limit]
        if self.heal:
            bounds = bounds[bounds < pos]
        base = int(bounds[-1]) if bounds.size else 0
        ja = view.tokens_upto(base)
        path = self._recovery_path(view.full[base:pos])
        if self.g.sync([*view.ids[:ja], *path]):
            self.stats.recovery_passes += 1
        rows = self.g.rows(ja, ja + len(path))
        result = walk(self.pair, rows, path, view.full[base:pos], mode=self.recovery,
                      cap=self.merge_cap)
        assert result.probs is not None
        probs = result.probs
        if self.lookahead and self.recovery == "token" and result.end_weight > 0:
            self._look_ahead(probs, rows[-1], result.end_weight, [*view.ids[:ja], *path])
        total = float(probs.sum())
        self.stats.recoveries += 1
        if total > 0:
            self.stats.uncertain += result.uncertain / total
            self.stats.dropped += result.dropped / (total + result.dropped)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.log(probs / total) if self.recovery == "token" and total > 0 \
                else result.logp(self.recovery)
        if not np.isfinite(logp).any():  # nothing mappable: the plain next-token mass
            with np.errstate(divide="ignore"):
                logp = np.log(self.pair.token_mass(np.exp(rows[-1].astype(np.float64))))
        return logp

    def _recovery_path(self, q: bytes) -> list[int]:
        """The Generalist's tokens for q, ending exactly at its end when they can.

        In context: q followed by a word ("\\n\\n" + "a" splits as "\\n", "\\n" for
        GPT-2-style pre-tokenizers) if that keeps a boundary at q's end, else q's own
        tokenization. An unfinished character at the end stays out (the walk covers it).
        """
        g = self.pair.g
        complete = utf8_complete(q)
        own = encode_bytes(g, q[:complete])
        if not own:
            return own
        probe = encode_bytes(g, q[:complete] + b"a")
        ends = ends_of(g, probe)
        inside = int(np.searchsorted(ends, complete, side="right"))
        if inside and int(ends[inside - 1]) == complete \
                and g.bytes_of(probe[:inside]) == q[:complete]:
            return list(probe[:inside])
        return own if g.bytes_of(own) == q[:complete] else []

    def _look_ahead(self, probs: np.ndarray, row: np.ndarray, weight: float,
                    prefix: list[int]) -> None:
        """Resolve the most probable `uncertain_g` tokens with one more Generalist step each.

        For such a token g the Specialist's next token may run past g's bytes; the step gives
        what follows g, and the mass moves to the S token that g's bytes plus the next token's
        start (`first_token` of the concatenation). The moved share is `stats.moved`.
        """
        pair = self.pair
        p = np.exp(row.astype(np.float64))
        flagged = np.flatnonzero(pair.uncertain_g & (p * weight >= _LOOKAHEAD_MIN))
        total = float(probs.sum())
        for gid in flagged[np.argsort(-p[flagged])][: self.lookahead]:
            self.g.sync([*prefix, int(gid)])
            after = np.exp(self.g.rows(len(prefix) + 1, len(prefix) + 1)[0].astype(np.float64))
            self.stats.lookahead_steps += 1
            here = int(pair.first_s[gid])
            mass = weight * float(p[gid])
            self.stats.examined += mass / total if total > 0 else 0.0
            for nxt in np.argsort(-after)[: self.merge_cap]:
                if pair.g.special[nxt] or not pair.g.pieces[nxt]:
                    continue
                sid = pair.first_token(pair.g.pieces[gid] + pair.g.pieces[nxt])
                if sid >= 0 and sid != here:
                    moved = mass * float(after[nxt])
                    probs[here] -= moved
                    probs[sid] += moved
                    self.stats.moved += moved / total if total > 0 else 0.0
            np.maximum(probs, 0.0, out=probs)
