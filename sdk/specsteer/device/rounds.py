"""The collaborative rounds: what the device does between two verdicts of the companion.

`SteeredRounds` runs SpecSteer's Draft–Verify–Recover (and classic speculative decoding, which
shares its shape): draft K tokens, send only their ids (and, when P_S0 is placed on the
device, the context-free Specialist's log-probabilities of them, in a frame of their own
computed while the companion scores the ids), wait for the verdict, fuse
the companion's sparse vector with the private term (`steer.fuse`) and pick the next token.
With `pipeline` it bets while it waits (see `SteeredRounds._bet`). `row_tokens` runs the
per-token baselines (the LLM alone, LightCoSteer, CoSteer) over the companion's top-k row.
Both yield (token, provenance) and leave the device's Specialist track holding exactly the
prompt plus every token yielded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specsteer import steer
from specsteer.device.drafting import Drafted, budget, draft
from specsteer.device.events import DecodeStats
from specsteer.device.leak_guard import LeakGuard, LeakHeld, best_allowed
from specsteer.device.rules import Rules, forbid, without
from specsteer.draft_length import DraftLength
from specsteer.errors import ProtocolError
from specsteer.link import CompanionLink
from specsteer.protocol import ErrorCode, HelloOk, Mode, SessionSettings, Verdict
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer.settings import Params

MODES = {"speculative": Mode.SPECULATIVE, "specsteer": Mode.SPECSTEER}  # others: Mode.ROWS
_ANY = Params()  # the budget fields' defaults, in a draft's key (`first_draft_key`)


def s0_placed_on_device(params: Params, hello_ok: HelloOk | None) -> bool:
    """Where P_S0 is computed: as asked, or (None) on the companion when it hosts the generic
    Specialist (its hello names one) and on the device otherwise, so no session is refused
    (`hello_ok` None: not known yet, so not on the device). `select="difference"` ranks the
    candidates by logp_G − α·logp_S0, which only a companion holding P_S0 can: it stays there."""
    if params.select == "difference":
        return False
    if params.s0_on_device is not None:
        return params.s0_on_device
    return hello_ok is not None and not hello_ok.specialist_sha256


def first_draft_key(params: Params) -> tuple[object, ...] | None:
    """What the first round's draft depends on besides the private prompt: the settings the
    device reads (`Params.device_view`: a rule added to `Params` counts without being named
    here), with the length budget as the draft sees it (its size, and where an end-of-text may
    be held) so that only the budget left after it may differ. None: it cannot be made ahead
    (sampling, or a method that does not draft)."""
    if params.temperature > 0 or params.method not in MODES:
        return None
    size = budget(params, params.k, 0)
    held = tuple((p < params.min_new_tokens, p < params.release_after) for p in range(size))
    rest = replace(params.device_view(), max_new_tokens=_ANY.max_new_tokens,
                   min_new_tokens=_ANY.min_new_tokens, end_release_from=_ANY.end_release_from)
    return size, held, rest


def first_draft(local: Track, params: Params, rules: Rules,
                stop: Callable[[], bool] | None = None) -> Drafted:
    """The first round's draft, made ahead of the request (`Client.prepare`): exactly what
    `SteeredRounds` drafts first (greedy, under the generation's `rules`); `stop` may cut it
    short, the round finishes it."""
    return draft(local, budget(params, params.k, 0), 0.0, None, rules.eos, stop=stop,
                 rules=rules)


@dataclass
class MadeAhead:
    """What the device made before the session's first round: the first round's draft
    (`first_draft`: the device's track holds the prompt plus its tokens) and, with P_S0 asked
    on the device, P_S0's track over the public prompt `s0_ids`, prefilled in the same passes
    as a round would (so neither changes the text). Made beside a cold start's opening, or by
    `Client.prepare` while the user typed."""

    draft: Drafted | None
    s0: Track | None = None
    s0_ids: tuple[int, ...] = ()

    def s0_over(self, public_ids: Sequence[int], room: int) -> Track | None:
        """P_S0's track, taken, if it holds exactly `public_ids` with room for `room` tokens;
        else it is closed (another request's public prompt, or a longer budget)."""
        s0, self.s0 = self.s0, None
        if s0 is not None and (self.s0_ids != tuple(public_ids) or s0.max_length < room):
            s0.close()
            return None
        return s0

    def close_s0(self) -> None:
        """Free P_S0's track: no session will use it."""
        if self.s0 is not None:
            self.s0.close()
            self.s0 = None


def s0_room(public_ids: Sequence[int], params: Params) -> int:
    """Tokens P_S0's track holds at most: the public prompt, the budget and a margin."""
    return len(public_ids) + params.max_new_tokens + 64


def s0_track(specialist: LanguageModel, public_ids: Sequence[int], params: Params) -> Track:
    """P_S0 on the device: the Specialist's track over the public ids alone (lazy)."""
    return Track(specialist, public_ids, s0_room(public_ids, params), lazy=True)


def s0_ahead_wanted(params: Params) -> bool:
    """Whether P_S0's public prefill can be made before the session opens: SpecSteer with
    P_S0 asked on the device (a choice left to the companion's hello is not known yet)."""
    return params.method == "specsteer" and s0_placed_on_device(params, None)


def make_ahead(specialist: LanguageModel, track: Track, params: Params, rules: Rules,
               stop: Callable[[], bool], *, drafts: bool,
               public_ids: Sequence[int] | None) -> MadeAhead:
    """After the device's prefill, before the session's first round: the first round's draft
    (`drafts`) and P_S0's prefill of `public_ids` (None: not on the device). `stop` skips what
    has not started; P_S0's prefill, once started, runs to its end."""
    made = MadeAhead(first_draft(track, params, rules, stop) if drafts else None)
    if public_ids is not None and not stop():
        made.s0, made.s0_ids = s0_track(specialist, public_ids, params), tuple(public_ids)
        made.s0.prefill()  # the passes a round's lazy prefill would run
    return made


def session_settings(params: Params, link: CompanionLink) -> SessionSettings:
    """The settings a session for `params` is opened with over `link` (after its hello)."""
    mode = MODES.get(params.method, Mode.ROWS)
    s0_here = mode is Mode.SPECSTEER and s0_placed_on_device(params, link.hello_ok)
    return params.session_settings(mode, s0_here)


def collaborate(
    specialist: LanguageModel,
    local: Track,
    public_prompt: list[int],
    committed: list[int],
    params: Params,
    link: CompanionLink,
    stats: DecodeStats,
    rng: np.random.Generator | None,
    guard: LeakGuard | None = None,
    round_: int = 0,
    ahead: Drafted | None = None,
    *,
    rules: Rules,
    ready: Callable[[], MadeAhead | None] | None = None,
) -> Iterator[tuple[int, str]]:
    """Open a session over the public prompt and yield (token, provenance) from its rounds.

    With tokens already `committed` (a reconnect mid-generation) the session is rebuilt with a
    `Resume` carrying them and the number of the next round, `round_`.
    A generator: nothing is sent before the first token is asked for, so every link failure
    surfaces at a `next()` of the decoding loop, which applies the offline policy. `guard`
    checks every draft before it leaves, after the output `committed` so far (raising
    `LeakHeld` under "hold"); the per-token baselines are not guarded. A session `link`
    already holds unused over this prompt and settings (`Client.prepare`) is used as it is;
    any other one is replaced. `ahead`: the first round's draft, made ahead (`first_draft`:
    `local` holds the prompt plus its tokens). `rules`: the generation's text rules
    (`device.rules`), which see the whole output (`committed` and what follows). `ready`:
    called once the session is open, before `local` is first used (a prefill running beside
    the opening ends there); it returns what was made beside the opening (`MadeAhead`), if
    anything: its draft is used as `ahead` is, its P_S0 track as the rounds' own.
    """
    settings = session_settings(params, link)
    mode, s0_here = settings.mode, settings.s0_on_device
    if committed or round_:
        link.resume(public_prompt, committed, settings, round_)
    elif link.holds(public_prompt, settings):
        stats.session_reused = True
    else:
        link.open(public_prompt, settings)
    made = ready() if ready is not None else None
    public_ids = [*public_prompt, *committed]
    # P_S0's track made ahead, if it is this session's (not when P_S0 went to the companion)
    ready_s0 = made.s0_over(public_ids, s0_room(public_ids, params)) if made else None
    if ready_s0 is not None and not s0_here:
        ready_s0.close()
        ready_s0 = None
    if mode is Mode.ROWS:
        yield from row_tokens(local, params, link, stats, rng, rules, committed)
        return
    if ahead is not None:  # a resume later in the generation keeps the count of its start
        stats.drafted_ahead = len(ahead.tokens)
    elif made is not None:
        ahead = made.draft
    s0 = ready_s0 or (s0_track(specialist, public_ids, params) if s0_here else None)
    yield from SteeredRounds(
        specialist, local, s0, params, link, stats, rng, mode, guard=guard, written=committed,
        ahead=ahead, rules=rules,
    ).tokens()


class SteeredRounds:
    """Draft–Verify–Recover rounds (or classic speculative ones) over one open session.

    Pipelining (greedy only, so the output is unchanged): while the companion verifies a draft,
    the device bets that all of it is accepted and that the bonus token is its own argmax, and
    drafts the next round; a lost bet is one rewind, a won bet hides a draft.
    """

    def __init__(
        self,
        specialist: LanguageModel,
        local: Track,
        s0: Track | None,
        params: Params,
        link: CompanionLink,
        stats: DecodeStats,
        rng: np.random.Generator | None,
        mode: Mode,
        *,
        guard: LeakGuard | None = None,
        written: list[int] | None = None,
        ahead: Drafted | None = None,
        rules: Rules,
    ) -> None:
        self.local, self.s0, self.params, self.link = local, s0, params, link
        self.stats, self.rng, self.mode = stats, rng, mode
        self.eos = specialist.tokenizer.eos_ids
        self.rules = rules
        self.pipeline = params.pipeline and params.temperature <= 0
        self.sizer = DraftLength(params.k, 1, params.k_max, self.pipeline) \
            if params.adaptive_k else None
        self.k = params.k
        self.committed: list[int] = []  # ids the companion has not seen yet
        self.produced = 0
        # the bet: next round's draft, made during the wait (or the first one, made ahead)
        self.ahead: Drafted | None = ahead
        self.ahead_s0: np.ndarray | None = None  # P_S0 rows of [guess, *ahead], same bet
        self.guard = guard
        # the output the companion holds once `committed` is sent (the guard's context; the
        # prompt's template is not history, so windows never reach into it)
        self.text: list[int] = list(written or [])
        self.withheld: tuple[int, int] | None = None  # (draft index, id) cut off by "redact"

    def tokens(self) -> Iterator[tuple[int, str]]:
        try:
            while True:
                finished = yield from self.round()
                if finished:
                    return
        finally:
            if self.s0 is not None:
                self.s0.close()

    def round(self) -> Generator[tuple[int, str], None, bool]:
        """One round: yields the tokens it settles; returns whether the generation ended
        (end-of-text). The first round's first token may come before its verdict (`_first`)."""
        stats = self.stats
        t0 = time.perf_counter()
        current = self._next_draft()
        self._guard(current)
        drafted = current.tokens
        off = len(self.committed)
        # the ids go up first: the companion's Generalist scores them during P_S0's pass
        self.link.submit_draft(drafted, self.committed)
        s0_base, s0_rows, s0_draft = self._s0_of_draft(drafted)
        if s0_draft is not None:
            self.link.send_draft_s0(s0_draft)
        # settled after the DraftS0 left: a yield waits on the caller, the companion should not
        first_candidates = self.link.opening_candidates()
        first = self._first(current, s0_rows, s0_draft, first_candidates)
        if first is not None:
            stats.device_s += time.perf_counter() - t0
            yield first[1], "draft" if first[0] else "recovered"
            t0 = time.perf_counter()
        current.settle(self.local)  # the bonus position's row, while the companion verifies
        guess = self._bet(current, s0_rows)
        stats.device_s += time.perf_counter() - t0
        verdict = self.link.wait_verdict()
        t1 = time.perf_counter()
        n = verdict.accepted
        if first is not None:
            _check_first(first, verdict, first_candidates)
        stats.rounds += 1
        stats.drafted += len(drafted)
        stats.accepted += n
        stats.accept_lengths.append(n)
        shown = 0 if first is None else 1  # tokens of this round already yielded
        if n == len(drafted) and drafted and drafted[-1] in self.eos:  # its end-of-text stands
            yield from [(t, "draft") for t in drafted][shown:]
            return True
        s0_row = None if s0_rows is None else s0_rows[off + n]
        # the token cut off by "redact" may not come back at its own position
        withheld = self.withheld[1] if self.withheld and self.withheld[0] == n else None
        self.withheld = None
        context = [*self.text, *drafted[:n]]
        if first is not None and not first[0]:  # settled from the opening's candidates
            token = first[1]
        else:
            token = self._recover(verdict, current.rows[n], s0_row, context,
                                  withheld, self.rules.banned(context, current.rows[n]))
        bet_won = None if self.ahead is None else n == len(drafted) and token == guess
        if self.sizer is not None and self.mode is Mode.SPECSTEER:
            self.k = self.sizer.observe(
                len(drafted), n, off + len(drafted), self.link.last_round_s, current.step_s,
                bet_won,
            )
        if bet_won:
            stats.pipelined += 1
        else:  # lost bet, or none placed: back to the accepted prefix
            self.ahead = self.ahead_s0 = None
            self.local.session.rewind(min(current.base + n, self.local.session.length))
        if self.s0 is not None and s0_rows is not None and self.ahead_s0 is None:
            self.s0.keep(s0_base + off + n, s0_rows[off + n])
        stats.device_s += time.perf_counter() - t1
        emitted = [(t, "draft") for t in drafted[:n]]
        emitted.append((token, "bonus" if n == len(drafted) else "recovered"))
        self.produced += len(emitted)
        self.text += [t for t, _ in emitted]
        self.committed = [token]
        yield from emitted[shown:]
        return token in self.eos

    def _first(self, current: Drafted, s0_rows: np.ndarray | None, s0_draft: list[float] | None,
               opening: tuple[tuple[int, ...], tuple[float, ...]] | None
               ) -> tuple[bool, int] | None:
        """The first round's first token before its verdict, from the candidates SessionOpened
        carried (the ones that verdict would carry if it rejects that draft): (accepted, the
        token) where the ratio test is certain on them, else None (wait for the verdict).
        Accepted: the first drafted id. Rejected: the fused pick over those candidates,
        exactly as `_recover` makes it from the verdict."""
        if opening is None or s0_draft is None or s0_rows is None or not current.tokens \
                or self.committed or self.produced:
            return None
        ids, values = opening
        passed = steer.first_ratio_test(current.tokens[0], s0_draft[0], ids, values,
                                        self.params.gamma)
        if passed is None or (passed and current.tokens[0] in self.eos):
            return None
        if passed:
            return True, current.tokens[0]
        # nothing withheld at position 0: "redact" cutting there leaves no draft to settle
        context = list(self.text)
        token = self._recover(Verdict(0, 0, ids, values), current.rows[0], s0_rows[0], context,
                              None, self.rules.banned(context, current.rows[0]))
        return False, token

    def _next_draft(self) -> Drafted:
        """This round's draft: the won bet, finished to full length, or a fresh one."""
        params = self.params
        size = budget(params, self.k, self.produced)
        if self.ahead is None:
            if self.committed:
                self.local.push(self.committed[-1])
            return draft(
                self.local, size, params.temperature, self.rng, self.eos, rules=self.rules,
                written=self.text, cancel=self.link.cancel, last_pending=True,
            )
        current, self.ahead = self.ahead, None
        # the bet was cut short when the verdict landed: finish it, so that a round's draft
        # (where its bonus falls, so the text) never depends on timing
        cut = len(current.tokens)
        draft(self.local, size, params.temperature, self.rng, self.eos, into=current,
              rules=self.rules, written=self.text, cancel=self.link.cancel, last_pending=True)
        if self.ahead_s0 is not None and len(current.tokens) > cut:
            assert self.s0 is not None
            extra = self.s0.extend(current.tokens[cut:])[1:]
            self.ahead_s0 = np.concatenate([self.ahead_s0, extra])
        return current

    def _guard(self, current: Drafted) -> None:
        """The leak guard's look at what is about to leave: the committed ids and the draft.
        "redact" cuts the draft at the flagged word's first drafted token; "hold" raises
        `LeakHeld`."""
        if self.guard is None:
            return
        sent = len(self.text) - len(self.committed)
        run = [*self.committed, *current.tokens]  # what would leave
        flag = self.guard.scan(self.text[:sent], run)
        if flag is None:
            return
        self.stats.leak_flagged += 1
        if self.guard.policy == "hold":
            raise LeakHeld(flag)
        if self.guard.policy == "redact":  # from the flagged word's first unsent token
            cut = max(0, self.guard.word_start(run, flag.index, len(self.committed))
                      - len(self.committed))
            if flag.index >= len(self.committed):
                self.withheld = (cut, current.tokens[cut])
            self.stats.leak_redacted += len(current.tokens) - cut
            self._cut(current, cut)

    def _cut(self, current: Drafted, cut: int) -> None:
        """Shorten the draft to its first `cut` tokens; both tracks forget the rest."""
        dropped = len(current.tokens) - cut
        if not dropped:
            return
        current.pending = False  # the token left pending is among those cut
        del current.tokens[cut:], current.rows[cut + 1 :]
        self.local.keep(current.base + cut, current.rows[cut])
        if self.ahead_s0 is not None:  # the won bet's P_S0 rows went past the cut as well
            assert self.s0 is not None
            off = len(self.committed)
            self.s0.keep(self.s0.length - dropped, self.ahead_s0[off + cut])
            self.ahead_s0 = self.ahead_s0[: off + cut + 1]

    def _s0_of_draft(
        self, drafted: list[int]
    ) -> tuple[int, np.ndarray | None, list[float] | None]:
        """With P_S0 on the device: (session base, its rows over committed + draft, the
        log-probabilities of the drafts that go up). Otherwise (0, None, None)."""
        if self.s0 is None:
            return 0, None, None
        off = len(self.committed)
        if self.ahead_s0 is not None:  # won bet: [guess, *draft] is already in the session
            base, rows = self.s0.length - off - len(drafted), self.ahead_s0
        else:
            base, rows = self.s0.length, self.s0.extend([*self.committed, *drafted])
        self.ahead_s0 = None
        lp = steer.log_softmax(rows, self.params.temperature)
        return base, rows, [float(lp[off + j, t]) for j, t in enumerate(drafted)]

    def _bet(self, current: Drafted, s0_rows: np.ndarray | None) -> int | None:
        """Draft the next round now, assuming every draft passes and the bonus is the
        Specialist's own argmax; returns that guess (None: no bet placed)."""
        drafted = current.tokens
        if not (self.pipeline and drafted and drafted[-1] not in self.eos):
            return None
        after = self.produced + len(drafted)
        guess = int(np.argmax(self.rules.forbid([*self.text, *drafted], current.rows[-1])))
        size = budget(self.params, self.k, after + 1)
        if guess in self.eos or size <= 0:
            return guess
        self.local.push(guess)
        # stop betting as soon as the verdict is in: waiting on it is the hot path
        self.ahead = draft(
            self.local, size, self.params.temperature, self.rng, self.eos,
            stop=self.link.reply_ready, rules=self.rules, written=[*self.text, *drafted, guess],
            cancel=self.link.cancel,
        )
        if self.s0 is not None and s0_rows is not None and not self.link.reply_ready():
            # same bet for P_S0: score [guess, *ahead] now, off the hot path
            self.ahead_s0 = self.s0.extend([guess, *self.ahead.tokens])
        return guess

    def _recover(
        self,
        verdict: Verdict,
        sc_row: np.ndarray,
        s0_row: np.ndarray | None,
        context: list[int],
        withheld: int | None = None,
        banned: frozenset[int] = frozenset(),
    ) -> int:
        """The token after the accepted drafts: the companion's correction (speculative), or
        the fused pick over its candidates with the private term added here.

        Ids in `banned` are never picked (end-of-text before the minimum length): if the
        companion offered nothing else, the Specialist's own choice stands in. Under "redact"
        a pick that is the token just cut from the draft (`withheld`: the flagged span's first
        token) or would complete a flagged span is turned away, and so is the same text in
        other spacing or case: the best other candidate, or (none left) the Specialist's best
        token that discloses nothing."""
        params = self.params
        if self.mode is Mode.SPECULATIVE:
            token = int(verdict.ids[0])
            if token not in banned:
                return token
            return int(np.argmax(forbid(sc_row, banned)))
        candidates = steer.SparseSteer(verdict.ids, verdict.values)
        if banned:
            allowed = without(candidates, banned)
            if allowed is None:
                return int(np.argmax(forbid(sc_row, banned)))
            candidates = allowed
        logp_s0 = None if s0_row is None else steer.log_softmax(s0_row, params.temperature)
        scores = steer.fuse(
            candidates, steer.log_softmax(sc_row, params.temperature), params.alpha, logp_s0
        )
        token = steer.pick(candidates.ids, scores, params.temperature, self.rng)
        guard = self.guard
        if guard is None or guard.policy != "redact":
            return token
        if token != withheld:
            if not guard.blocks(context, token):
                return token
            self.stats.leak_flagged += 1  # a new span, begun by the pick itself
            self.stats.leak_redacted += 1
        allowed = guard.redact_mask(context, candidates.ids, withheld)
        if not allowed.any():
            return best_allowed(guard, context, sc_row, withheld)
        return steer.pick(candidates.ids, np.where(allowed, scores, -np.inf), params.temperature,
                          self.rng)


def _check_first(first: tuple[bool, int], verdict: Verdict,
                 opening: tuple[tuple[int, ...], tuple[float, ...]] | None) -> None:
    """The first round's verdict must agree with what the device settled from SessionOpened's
    candidates (its first token is already shown): a companion whose two answers differ is
    broken, and the generation stops rather than go on from a text the method did not write."""
    accepted, _ = first
    if (verdict.accepted > 0) != accepted:
        raise ProtocolError(ErrorCode.BAD_VALUE, "the first verdict "
                            f"{'rejects' if accepted else 'accepts'} the first draft, where the "
                            "candidates SessionOpened carried settle it the other way")
    if not accepted and opening != (verdict.ids, verdict.values):
        raise ProtocolError(ErrorCode.BAD_VALUE, "the first verdict's candidates are not the "
                            "ones SessionOpened carried for the same position")


def row_tokens(
    local: Track,
    params: Params,
    link: CompanionLink,
    stats: DecodeStats,
    rng: np.random.Generator | None,
    rules: Rules,
    written: Sequence[int] = (),
) -> Iterator[tuple[int, str]]:
    """Per-token baselines: LLM alone, LightCoSteer and CoSteer over the companion's top-k row.
    `written`: the output before this session (a resume); the `rules` see the whole output."""
    committed: list[int] = []
    committed_all: list[int] = []  # every token of this session: the minimum length counts them
    needs_local = params.method != "llm"
    while True:
        t0 = time.perf_counter()
        if committed and needs_local:
            local.push(committed[-1])
        stats.device_s += time.perf_counter() - t0
        reply = link.row(committed)
        t1 = time.perf_counter()
        ids = np.asarray(reply.ids, np.int64)
        logp_g = np.asarray(reply.logp_g, np.float32)
        if params.method == "llm":
            scores = logp_g
        else:
            logp_sc = steer.log_softmax(local.row, params.temperature)[ids]
            logp_s0 = np.asarray(reply.logp_s0, np.float32)
            if params.method == "light_costeer":
                scores = steer.light_costeer(logp_g, logp_sc, logp_s0, params.beta)
            else:
                scores = steer.costeer(
                    logp_g, logp_sc, logp_s0, iterations=params.costeer_iterations, beta=params.beta
                )
        # the model the token is picked from decides an early end: the Generalist alone, or
        # the Specialist (which sees the user's texts) for the steered baselines
        banned = rules.banned([*written, *committed_all],
                              *((logp_g, ids) if params.method == "llm" else (local.row,)))
        scores = forbid(scores, banned, ids)
        token = steer.pick(ids, scores, params.temperature, rng) \
            if np.isfinite(scores).any() else int(np.argmax(forbid(local.row, banned)))
        committed_all.append(token)
        stats.rounds += 1
        stats.device_s += time.perf_counter() - t1
        yield token, "generalist"
        if token in rules.eos:
            return
        committed = [token]
