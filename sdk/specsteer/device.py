"""The device's decoding loop: draft locally, verify remotely, fuse the private term locally.

`decode` is a generator of `TokenEvent`s (token id + provenance), like mlx-lm's generate_step:
no text handling, no I/O of its own; the companion is reached only through a `CompanionLink`.
It runs SpecSteer and every baseline of the papers on the same runtime pieces, so the
evaluation harness compares like with like. What goes up: public prompt ids, drafted ids, and
(only with `s0_on_device`) the context-free Specialist's log-probabilities of the drafts.
Never the private prompt, never P_Sc.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from specsteer import steer
from specsteer.draft_length import DraftLength
from specsteer.errors import CompanionError, CompanionUnavailable, ProtocolError
from specsteer.link import CompanionLink
from specsteer.protocol import HelloOk, Mode, Select
from specsteer.runtime.base import LanguageModel, Session

METHODS = ("slm", "slm_rag", "llm", "speculative", "light_costeer", "costeer", "specsteer")
LOCAL_METHODS = ("slm", "slm_rag")
# "fast" also halves the candidate set: the fused choice ranked within the Generalist's top 32
# at 416 of 417 measured positions, so the text is nearly always the top-64 one, at ~60 % of
# the bytes (bench/candidates.py, docs/BENCHMARKS.md)
PRESETS = {
    "default": {"gamma": 0.5},
    "fast": {"gamma": 0.1, "top_k": 32},
    "strict": {"gamma": 1.0},
}


@dataclass(frozen=True)
class Params:
    """Decoding parameters; defaults are the paper's."""

    method: str = "specsteer"
    gamma: float = 0.5
    alpha: float = 1.0
    k: int = 4
    top_k: int = 64
    top_p: float = 1.0  # < 1: nucleus cut of the candidates (fewer bytes down; 1 = paper's top-k)
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0
    select: str = "generalist"  # or "difference" (METHOD.md: worse; kept to report it)
    # where P_S0 is computed: None = the companion when it hosts the generic Specialist, else the
    # device; True pays when the Specialist is much cheaper than the Generalist (int4)
    s0_on_device: bool | None = None
    costeer_iterations: int = 20
    beta: float = 1.0
    pipeline: bool = True  # draft the next round while the companion verifies (greedy only)
    adaptive_k: bool = False  # choose K each round in [1, k_max] from measured costs (starts at k)
    k_max: int = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.k < 0 or self.top_k < 1 or self.max_new_tokens < 0 or self.gamma < 0:
            raise ValueError("k >= 0, top_k >= 1, max_new_tokens >= 0 and gamma >= 0 are required")
        if self.select not in ("generalist", "difference"):
            raise ValueError("select must be 'generalist' or 'difference'")
        if self.adaptive_k and not 1 <= self.k <= self.k_max:
            raise ValueError("adaptive_k needs 1 <= k <= k_max")


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token and where it came from.

    provenance: "draft" (Specialist draft accepted by the companion), "recovered" (chosen after a
    reject by fusing the companion's sparse vector with the private term), "bonus" (same fusion
    after a fully accepted draft), "generalist" (baselines steered by the Generalist's row every
    token), "local" (the Specialist alone: local methods or offline-degraded mode).
    """

    token: int
    provenance: str
    round: int


@dataclass
class DecodeStats:
    """Counters of one generation; timings in seconds."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    prefill_s: float = 0.0
    device_s: float = 0.0
    wait_s: float = 0.0
    first_token_s: float | None = None
    degraded: bool = False
    offline_reason: str | None = None
    reconnects: int = 0  # times collaboration resumed after going local
    pipelined: int = 0  # rounds whose draft was made while the previous one was verified
    accept_lengths: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class DevicePrompt:
    """The two views of one request: with the private context (device only) and without."""

    private_ids: Sequence[int]  # chat prompt with the retrieved history: P_Sc, never sent
    public_ids: Sequence[int]  # the same request without it: what the companion sees


class _Local:
    """The Specialist's session with its row for the next position.

    The prompt is prefilled on first use, so a method that never needs the Specialist (the LLM
    baseline, until the companion goes away) never pays for it.
    """

    def __init__(self, model: LanguageModel, prompt: Sequence[int], max_new: int) -> None:
        self.session: Session = model.new_session(max_length=len(prompt) + max_new + 64)
        self._pending: list[int] | None = list(prompt)
        self._row: np.ndarray | None = None

    @property
    def row(self) -> np.ndarray:
        if self._pending is not None:
            self._row = self.session.append(self._pending)[-1]
            self._pending = None
        assert self._row is not None
        return self._row

    @row.setter
    def row(self, value: np.ndarray) -> None:
        self._row = value

    @property
    def length(self) -> int:
        """Tokens held, the prompt included (prefills it first if that has not happened)."""
        self.row  # noqa: B018
        return self.session.length

    def push(self, token: int) -> np.ndarray:
        self.row  # noqa: B018 - prefill first if it has not happened yet
        self._row = self.session.append([token])[-1]
        return self._row

    def resync(self, sequence: Sequence[int]) -> None:
        """Hold exactly `sequence` again (after an interrupted round, or never prefilled)."""
        self._pending = None
        keep = min(self.session.length, len(sequence) - 1)
        self.session.rewind(keep)
        self._row = self.session.append(list(sequence[keep:]))[-1]


def _choose(row: np.ndarray, temperature: float, rng: np.random.Generator | None) -> int:
    if temperature <= 0 or rng is None:
        return int(np.argmax(row))
    return steer.sample_index(np.exp(steer.log_softmax(row, temperature)), rng)


@dataclass(frozen=True)
class OfflinePolicy:
    """What to do when the companion is unreachable or fails.

    "degrade": go on with the local Specialist (with context) and keep trying to reconnect
    with exponential backoff, resuming collaborative decoding in the same generation;
    "fail": raise CompanionUnavailable; "wait(SECONDS)": block, retrying, up to SECONDS, then
    fail.
    """

    mode: str = "degrade"
    wait_s: float = 0.0
    first_retry_s: float = 0.5
    max_retry_s: float = 8.0

    @classmethod
    def parse(cls, text: str | OfflinePolicy) -> OfflinePolicy:
        if isinstance(text, OfflinePolicy):
            return text
        spec = text.strip().lower()
        if spec in ("degrade", "fail"):
            return cls(spec)
        if spec.startswith("wait(") and spec.endswith(")"):
            try:
                return cls("wait", float(spec[5:-1]))
            except ValueError:
                pass
        raise ValueError(f"offline must be 'degrade', 'fail' or 'wait(SECONDS)', not {text!r}")


@dataclass(frozen=True)
class ModeChange:
    """The generation switched between collaborative and local decoding (after `tokens`)."""

    mode: str  # "collaborative" | "local"
    tokens: int
    reason: str


_LINK_ERRORS = (CompanionUnavailable, CompanionError, ProtocolError)


def decode(
    specialist: LanguageModel,
    prompt: DevicePrompt,
    params: Params,
    link: CompanionLink | None = None,
    stats: DecodeStats | None = None,
    *,
    connect: Callable[[], CompanionLink] | None = None,
    offline: OfflinePolicy | str = "degrade",
    on_mode: Callable[[ModeChange], None] | None = None,
) -> Iterator[TokenEvent]:
    """Yield generated tokens for `prompt` with `params.method`; stops at end-of-text.

    `link` is an open companion link, or None with `connect` a factory of new ones (it raises
    on failure). When the companion is unreachable or fails, `offline` decides: with "degrade"
    the tokens come from the local Specialist (provenance "local"), `stats.degraded` is set, and
    `connect` is retried with backoff; a reconnect re-opens the session on the public prompt
    plus everything committed so far and collaboration resumes in the same generation.
    """
    policy = OfflinePolicy.parse(offline)
    stats = stats if stats is not None else DecodeStats()
    eos = specialist.tokenizer.eos_ids
    rng = np.random.default_rng(params.seed) if params.temperature > 0 else None
    started = time.perf_counter()
    private = params.method != "slm"
    prompt_ids = list(prompt.private_ids if private else prompt.public_ids)
    local = _Local(specialist, prompt_ids, params.max_new_tokens)
    if params.method != "llm":  # the LLM baseline needs the Specialist only if it goes offline
        local.row  # noqa: B018 - prefill now, timed as such
    stats.prefill_s += time.perf_counter() - started
    out: list[int] = []
    collaborative = params.method not in LOCAL_METHODS
    retry_in = policy.first_retry_s
    next_retry = 0.0

    def emit(token: int, provenance: str) -> TokenEvent:
        out.append(token)
        stats.tokens += 1
        if stats.first_token_s is None:
            stats.first_token_s = time.perf_counter() - started
        return TokenEvent(token, provenance, stats.rounds)

    links: list[CompanionLink] = []

    def remote_from(new_link: CompanionLink) -> Iterator[tuple[int, str]]:
        links.append(new_link)
        public = DevicePrompt(prompt.private_ids, [*prompt.public_ids, *out])
        left = replace(params, max_new_tokens=params.max_new_tokens - len(out))
        return _remote_tokens(specialist, local, public, left, new_link, stats, rng)

    def drop(generator: Iterator[tuple[int, str]] | None) -> None:
        if generator is not None:
            generator.close()  # type: ignore[attr-defined]
        while links:
            links.pop().close()

    def went_local(reason: str) -> None:
        nonlocal next_retry, retry_in
        stats.degraded = True
        stats.offline_reason = reason
        retry_in = policy.first_retry_s
        next_retry = time.monotonic() + retry_in
        if on_mode is not None:
            on_mode(ModeChange("local", len(out), reason))

    def wait_for_link(reason: str) -> CompanionLink:
        deadline = time.monotonic() + policy.wait_s
        delay = policy.first_retry_s
        while True:
            try:
                return _connect(connect)
            except _LINK_ERRORS as exc:
                reason = str(exc)
            if time.monotonic() + delay > deadline:
                raise CompanionUnavailable(f"no companion within {policy.wait_s:g} s: {reason}")
            time.sleep(delay)
            delay = min(delay * 2, policy.max_retry_s)

    remote: Iterator[tuple[int, str]] | None = None
    probe: Future[CompanionLink] | None = None
    try:
        if collaborative:
            try:
                remote = remote_from(link if link is not None else _connect(connect))
            except _LINK_ERRORS as exc:
                if policy.mode == "fail":
                    raise
                if policy.mode == "wait":
                    remote = remote_from(wait_for_link(str(exc)))
                else:
                    went_local(str(exc))
        while len(out) < params.max_new_tokens:
            if remote is not None:
                try:
                    token, provenance = next(remote)
                except StopIteration:
                    return
                except _LINK_ERRORS as exc:
                    drop(remote)
                    remote = None
                    local.resync([*prompt_ids, *out])
                    if policy.mode == "fail":
                        raise
                    if policy.mode == "wait":
                        remote = remote_from(wait_for_link(str(exc)))
                    else:
                        went_local(str(exc))
                    continue
                yield emit(token, provenance)
                if token in eos:
                    return
                continue
            if collaborative and connect is not None:
                # probe in the background so a stalled companion never freezes the stream
                if probe is None and time.monotonic() >= next_retry:
                    probe = _probe(connect)
                elif probe is not None and probe.done():
                    finished, probe = probe, None
                    try:
                        remote = remote_from(finished.result())
                    except _LINK_ERRORS:
                        retry_in = min(retry_in * 2, policy.max_retry_s)
                        next_retry = time.monotonic() + retry_in
                    else:
                        stats.reconnects += 1
                        if on_mode is not None:
                            on_mode(ModeChange("collaborative", len(out), "companion is back"))
                        continue
            t0 = time.perf_counter()
            token = _choose(local.row, params.temperature, rng)
            if token not in eos:
                local.push(token)
            stats.device_s += time.perf_counter() - t0
            stats.rounds += 1
            yield emit(token, "local")
            if token in eos:
                return
    finally:
        drop(remote)
        if probe is not None:  # a late reconnect nobody will use: close it when it lands
            probe.add_done_callback(_close_quietly)
        local.session.close()


def _probe(connect: Callable[[], CompanionLink] | None) -> Future[CompanionLink]:
    """Try `connect` on a thread of its own: a stalled companion blocks only that thread."""
    future: Future[CompanionLink] = Future()

    def run() -> None:
        try:
            future.set_result(_connect(connect))
        except BaseException as exc:  # delivered to the decoding loop through the future
            future.set_exception(exc)

    threading.Thread(target=run, name="specsteer-reconnect", daemon=True).start()
    return future


def _close_quietly(future: Future[CompanionLink]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _connect(connect: Callable[[], CompanionLink] | None) -> CompanionLink:
    if connect is None:
        raise CompanionUnavailable("no companion configured")
    return connect()


def s0_placed_on_device(params: Params, hello_ok: HelloOk | None) -> bool:
    """Where P_S0 is computed: as asked, or (None) on the companion when it hosts the generic
    Specialist (its hello names one) and on the device otherwise, so no session is refused."""
    if params.s0_on_device is not None:
        return params.s0_on_device
    return hello_ok is not None and not hello_ok.specialist_sha256


def _remote_tokens(
    specialist: LanguageModel,
    local: _Local,
    prompt: DevicePrompt,
    params: Params,
    link: CompanionLink,
    stats: DecodeStats,
    rng: np.random.Generator | None,
) -> Iterator[tuple[int, str]]:
    """The collaborative part: yields (token, provenance); the local session follows along."""
    mode = {"speculative": Mode.SPECULATIVE, "specsteer": Mode.SPECSTEER}.get(
        params.method, Mode.ROWS
    )
    alpha = 0.0 if params.method == "llm" else params.alpha
    s0_here = mode is Mode.SPECSTEER and s0_placed_on_device(params, link.hello_ok)
    link.open(
        prompt.public_ids,
        mode=mode,
        gamma=params.gamma,
        alpha=alpha,
        top_k=params.top_k,
        temperature=params.temperature,
        seed=params.seed,
        select=Select.TOP_DIFFERENCE if params.select == "difference" else Select.TOP_LOGP_G,
        s0_on_device=s0_here,
        top_p=params.top_p,
    )
    eos = specialist.tokenizer.eos_ids
    if mode is Mode.ROWS:
        yield from _row_tokens(local, params, link, stats, rng, eos)
        return
    s0 = (
        _Local(specialist, prompt.public_ids, params.max_new_tokens)
        if s0_here
        else None
    )
    # Pipelining (greedy only, so the output is unchanged): while the companion verifies a
    # draft, the device bets that all of it is accepted and that the bonus token is its own
    # argmax, and drafts the next round; a lost bet is one rewind, a won bet hides a draft.
    pipeline = params.pipeline and params.temperature <= 0
    committed: list[int] = []  # ids the companion has not seen yet
    produced = 0
    ahead: _Drafted | None = None
    ahead_s0: np.ndarray | None = None  # P_S0 rows of [guess, *ahead], scored during the wait
    sizer = DraftLength(params.k, 1, params.k_max, pipeline) if params.adaptive_k else None
    k = params.k
    try:
        while True:
            t0 = time.perf_counter()
            if ahead is not None:  # won bet
                current, ahead = ahead, None
                # the bet was cut short when the verdict landed: finish it, so that a round's
                # draft (where its bonus falls, so the text) never depends on timing
                cut = len(current.tokens)
                _draft(local, _budget(params, k, produced), params.temperature, rng, eos,
                       into=current)
                if ahead_s0 is not None and len(current.tokens) > cut:
                    extra = s0.session.append(current.tokens[cut:])
                    ahead_s0 = np.concatenate([ahead_s0, extra])
            else:
                if committed:
                    local.push(committed[-1])
                current = _draft(local, _budget(params, k, produced), params.temperature, rng, eos)
            draft, rows = current.tokens, current.rows
            s0_draft = s0_rows = None
            off = len(committed)
            if s0 is not None:
                if ahead_s0 is not None:  # won bet: [guess, *draft] is already in the session
                    s0_base, s0_rows = s0.length - off - len(draft), ahead_s0
                else:
                    s0_base, s0_rows = s0.length, _extend(s0, [*committed, *draft])
                ahead_s0 = None
                lp = steer.log_softmax(s0_rows, params.temperature)
                s0_draft = [float(lp[off + j, t]) for j, t in enumerate(draft)]
            link.submit_draft(draft, committed, s0_draft)
            guess = None
            if pipeline and draft and draft[-1] not in eos:
                guess = int(np.argmax(rows[-1]))
                next_budget = _budget(params, k, produced + len(draft) + 1)
                if guess not in eos and next_budget > 0:
                    local.push(guess)
                    # stop betting as soon as the verdict is in: waiting on it is the hot path
                    ahead = _draft(
                        local, next_budget, params.temperature, rng, eos, stop=link.reply_ready
                    )
                    if s0 is not None and s0_rows is not None and not link.reply_ready():
                        # same bet for P_S0: score [guess, *ahead] now, off the hot path
                        s0.row = s0_rows[-1]
                        ahead_s0 = _extend(s0, [guess, *ahead.tokens])
            stats.device_s += time.perf_counter() - t0
            verdict = link.wait_verdict()
            t1 = time.perf_counter()
            n = verdict.accepted
            stats.rounds += 1
            stats.drafted += len(draft)
            stats.accepted += n
            stats.accept_lengths.append(n)
            if n == len(draft) and draft and draft[-1] in eos:  # the draft's end-of-text stands
                yield from ((t, "draft") for t in draft)
                return
            ids = np.asarray(verdict.ids, np.int64)
            values = np.asarray(verdict.values, np.float32)
            if mode is Mode.SPECULATIVE:
                token = int(ids[0])
            else:
                logp_sc = steer.log_softmax(rows[n], params.temperature)[ids]
                if s0 is not None and s0_rows is not None:
                    logp_s0 = steer.log_softmax(s0_rows[off + n], params.temperature)[ids]
                    scores = values + params.alpha * (logp_sc - logp_s0)
                else:
                    scores = values + params.alpha * logp_sc
                token = steer.pick(ids, scores, params.temperature, rng)
            bet = None if ahead is None else n == len(draft) and token == guess
            if sizer is not None and mode is Mode.SPECSTEER:
                k = sizer.observe(
                    len(draft), n, off + len(draft), link.last_round_s, current.step_s, bet
                )
            if bet:
                stats.pipelined += 1
            else:  # lost bet, or none placed: back to the accepted prefix
                ahead = ahead_s0 = None
                local.session.rewind(min(current.base + n, local.session.length))
            if s0 is not None and s0_rows is not None and ahead_s0 is None:
                s0.session.rewind(s0_base + off + n)
                s0.row = s0_rows[off + n]
            stats.device_s += time.perf_counter() - t1
            stats.wait_s = link.stats.wait_s
            for t in draft[:n]:
                produced += 1
                yield t, "draft"
            produced += 1
            yield token, ("bonus" if n == len(draft) else "recovered")
            if token in eos:
                return
            committed = [token]
    finally:
        if s0 is not None:
            s0.session.close()


@dataclass
class _Drafted:
    """One round's draft: tokens, the Specialist rows predicting each and the one after."""

    base: int  # session length before the first drafted token
    tokens: list[int]
    rows: list[np.ndarray]
    step_s: float | None = None  # seconds per drafted token (feeds the adaptive K)


def _budget(params: Params, k: int, produced: int) -> int:
    """Draft length (at most k) that leaves room for the round's recovered/bonus token."""
    return max(0, min(k, params.max_new_tokens - produced - 1))


def _draft(
    local: _Local,
    k: int,
    temperature: float,
    rng: np.random.Generator | None,
    eos: frozenset[int],
    stop: Callable[[], bool] | None = None,
    into: _Drafted | None = None,
) -> _Drafted:
    """Draft up to k tokens (`stop` cuts it short), or continue the draft `into` up to k."""
    drafted = into if into is not None else _Drafted(local.length, [], [local.row])
    started, before = time.perf_counter(), len(drafted.tokens)
    while len(drafted.tokens) < k and not (drafted.tokens and drafted.tokens[-1] in eos):
        if stop is not None and drafted.tokens and stop():
            break
        token = _choose(drafted.rows[-1], temperature, rng)
        drafted.tokens.append(token)
        if token in eos:  # an end-of-text draft is not appended: nothing follows it
            break
        drafted.rows.append(local.push(token))
    if len(drafted.tokens) > before:
        drafted.step_s = (time.perf_counter() - started) / (len(drafted.tokens) - before)
    return drafted


def _extend(track: _Local, ids: Sequence[int]) -> np.ndarray:
    """Rows predicting each of `ids` and the position after: [len(ids)+1, V]."""
    if not ids:
        return track.row[None, :]
    return np.concatenate([track.row[None, :], track.session.append(list(ids))])


def _row_tokens(
    local: _Local,
    params: Params,
    link: CompanionLink,
    stats: DecodeStats,
    rng: np.random.Generator | None,
    eos: frozenset[int],
) -> Iterator[tuple[int, str]]:
    """Per-token baselines: LLM alone, LightCoSteer and CoSteer over the companion's top-k row."""
    committed: list[int] = []
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
        token = steer.pick(ids, scores, params.temperature, rng)
        stats.rounds += 1
        stats.device_s += time.perf_counter() - t1
        stats.wait_s = link.stats.wait_s
        yield token, "generalist"
        if token in eos:
            return
        committed = [token]
