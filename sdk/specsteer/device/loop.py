"""`decode`: one generation on the device, collaborative while it can be, local when it must.

A generator of `TokenEvent`s (token id + provenance), like mlx-lm's generate_step: no text,
no I/O of its own; the companion is reached only through a `CompanionLink`, the rounds live in
`device.rounds` and the offline policy in `device.offline`. What goes up: public prompt ids,
drafted ids, and (only with `s0_on_device`) the context-free Specialist's log-probabilities of
the drafts. Never the private prompt, never P_Sc.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from specsteer.device.drafting import Drafted, choose
from specsteer.device.events import DecodeStats, DevicePrompt, TokenEvent
from specsteer.device.leak_guard import LeakGuard, LeakHeld
from specsteer.device.offline import LINK_ERRORS, ModeChange, OfflinePolicy, Reconnector
from specsteer.device.rounds import (
    MODES,
    MadeAhead,
    collaborate,
    first_draft_key,
    make_ahead,
    s0_ahead_wanted,
)
from specsteer.device.rules import make_rules
from specsteer.device.warm import BackgroundPrefill, estimated_prefill_s
from specsteer.errors import (
    CompanionRefused,
    CompanionTimedOut,
    CompanionUnavailable,
    GenerationCancelled,
)
from specsteer.link import CompanionLink
from specsteer.runtime.base import CancellableSession, LanguageModel
from specsteer.runtime.track import Track
from specsteer.settings import Params
from specsteer.workers import Workers

CLOSE_GRACE_S = 0.05  # a cancelled generation waits this long at most for its links to close


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
    cancel: threading.Event | None = None,
    local: Track | None = None,
    switch_after: int | None = None,
    guard: LeakGuard | None = None,
    ahead: MadeAhead | None = None,
    workers: Workers | None = None,
) -> Iterator[TokenEvent]:
    """Yield generated tokens for `prompt` with `params.method`; stops at end-of-text.

    `link` is an open companion link, or None with `connect` a factory of new ones (it raises
    on failure). When the companion is unreachable or fails, `offline` decides: with "degrade"
    the tokens come from the local Specialist (provenance "local"), `stats.degraded` is set, and
    `connect` is retried with backoff; a reconnect re-opens the session on the public prompt
    plus everything committed so far and collaboration resumes in the same generation.

    `cancel`: once set (from any thread), the generation ends at the next token or prefill
    chunk boundary with `stats.cancelled` set; its companion session is closed as usual.
    `local`: the Specialist's track over the private prompt, prefilled or pending, when the
    caller keeps one between generations (`specsteer.prepared`: the Client's, paced so that a
    cancel lands within ~0.1 s); it is not closed here. Without one, the prefill runs in fixed
    128-token passes: pass boundaries change logits by float rounding, which can flip a
    near-tie, and a timed pace would make the text depend on the machine's load (the eval
    harness and the pinned outputs decode here).

    Cold (no warm start), on a runtime whose pass releases the GIL (`CancellableSession`, the
    device's): the private prefill runs on a thread of its own while the companion connects,
    says hello and prefills the public prompt; the first round waits for both. The text is the
    same as with the prefill first (the same passes), and the wait is the longer of the two
    instead of their sum (`stats.session_ready_s` says when the companion was ready).

    Warm start (`params.warm_start`, SpecSteer and speculative decoding, a companion reachable
    and the prefill left estimated at `params.warm_start_min_s` or more): the
    companion writes Generalist tokens from the public prompt (the LLM baseline's rows,
    provenance "generalist") while the device prefills on a background thread; at the first
    token boundary after the prefill is done, the device appends the tokens written so far and
    re-opens the session on the public prompt plus those tokens, exactly as after a reconnect.
    `switch_after` pins that switch at a token count instead (tests and benchmarks: it waits
    for the prefill there), so where it happens never depends on timing.

    `guard` checks what leaves (`params.leak_guard`); by default it is built from the prompt's
    two views. Pass one built over more private text (e.g. the whole history) to guard that too.
    `ahead`: what `Client.prepare` made for these params (`rounds.make_ahead`): the first
    round's draft (`local` then holds the prompt plus its tokens) and P_S0's public track,
    used when it holds this public prompt. `workers`: where the
    generation's background threads start (a warm start's prefill, reconnect probes, links
    closed after a cancel), so that their owner (the Client) joins them; by default its own.
    """
    workers = workers if workers is not None else Workers()
    generation = _Generation(
        specialist, prompt, params, stats if stats is not None else DecodeStats(),
        Reconnector(OfflinePolicy.parse(offline), connect, workers), workers, on_mode=on_mode,
        cancel=cancel if cancel is not None else threading.Event(), local=local,
        switch_after=switch_after, guard=guard, ahead=ahead)
    yield from generation.run(link)


class _Generation:
    """The state of one `decode` call: tokens so far, the local track, the remote rounds."""

    def __init__(
        self,
        specialist: LanguageModel,
        prompt: DevicePrompt,
        params: Params,
        stats: DecodeStats,
        links: Reconnector,
        workers: Workers,
        *,
        on_mode: Callable[[ModeChange], None] | None,
        cancel: threading.Event,
        local: Track | None,
        switch_after: int | None,
        guard: LeakGuard | None,
        ahead: MadeAhead | None,
    ) -> None:
        self.specialist, self.prompt, self.params = specialist, prompt, params
        self.stats, self.links, self.workers = stats, links, workers
        self.policy = links.policy
        self.on_mode, self.cancel = on_mode, cancel
        self.ahead: Drafted | None = ahead.draft if ahead is not None else None  # prepare's
        self.eos = specialist.tokenizer.eos_ids
        self.rules = make_rules(params, specialist.tokenizer)  # the text rules, composed once
        self.rng = np.random.default_rng(params.seed) if params.temperature > 0 else None
        self.out: list[int] = []
        self.remote: Iterator[tuple[int, str]] | None = None
        self.open_links: list[CompanionLink] = []
        self.next_round = 0  # protocol number of the next Draft: a Resume carries it on
        self.may_resync = True  # one immediate resync per drop, again once a token came through
        self.resyncing = False  # the current link is a resync that has not yielded a token yet
        self.started = time.perf_counter()
        # the SLM baseline reads the public prompt; every other method the private one
        self.prompt_ids = list(prompt.private_ids if params.method != "slm" else prompt.public_ids)
        room = len(self.prompt_ids) + params.max_new_tokens + 64
        self.switch_after = switch_after
        self.warming: BackgroundPrefill | None = None
        self.prefilling: BackgroundPrefill | None = None  # cold, beside the session's opening
        # made beside the session's opening (or P_S0's track, by prepare), no round's yet
        self.made: MadeAhead | None = None
        if ahead is not None and ahead.s0 is not None:
            self.made = MadeAhead(None, ahead.s0, ahead.s0_ids)
        self.owns_local = local is None
        self.local = local if local is not None else \
            Track(specialist, self.prompt_ids, room, lazy=True)
        self.guard = guard if guard is not None or not params.collaborative else LeakGuard(
            specialist.tokenizer, prompt.private_ids, prompt.public_ids,
            policy=params.leak_guard, n=params.leak_guard_n,
        )
        self.held = False  # the leak guard stopped collaboration for the rest of the generation

    def run(self, link: CompanionLink | None) -> Iterator[TokenEvent]:
        try:
            yield from self._run(link)
        except GenerationCancelled:
            self.stats.cancelled = True
        finally:
            if self.warming is not None:  # it ended before the switch: every token so far
                self.stats.warm_tokens = len(self.out)
                self.warming.abandon()
            if self.prefilling is not None:
                self.prefilling.abandon()
                self.made = self.prefilling.made
            self._drop_made()  # made beside an opening no round took
            # cancelled: the caller gets control back now; a companion busy on a round (or a
            # websocket's close handshake) takes the links' closing off its wait
            self._drop_remote(background=self.cancel.is_set())
            self.links.close()
            if self.owns_local:
                self.local.close()

    def _run(self, link: CompanionLink | None) -> Iterator[TokenEvent]:
        params, stats = self.params, self.stats
        if link is not None:
            self._hold_link(link)  # closed with the generation, used or not
        if self.cancel.is_set():
            raise GenerationCancelled("generation cancelled")
        warm = self._warm_start_wanted(link)
        if warm:
            self.warming = BackgroundPrefill(self.local, self.cancel, self.workers)
        elif self._overlap_wanted(link):
            self.prefilling = BackgroundPrefill(self.local, self.cancel, self.workers,
                                                then=self._first_round_then())
        elif params.method != "llm":  # the LLM baseline needs the Specialist only offline
            self.local.prefill(self.cancel)
            stats.prefill_s += time.perf_counter() - self.started
        if params.collaborative:
            try:
                if link is None:
                    link = self.links.connect()
                    self._hold_link(link)
                self._collaborate(link, warm=warm)
            except CompanionRefused:  # a configuration mistake, not "offline"
                raise
            except LINK_ERRORS as exc:
                self._end_warm_start()
                self._end_prefill()
                self._drop_ahead()
                self._lost(exc)
        while len(self.out) < params.max_new_tokens:
            if self.cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            if self.warming is not None and self._switch_due():
                self._switch()
            if self.remote is not None:
                try:
                    token, provenance = next(self.remote)
                except StopIteration:
                    return
                except LeakHeld as held:
                    self._hold(str(held))
                    continue
                except CompanionRefused:
                    raise
                except LINK_ERRORS as exc:
                    self._drop_remote()
                    self._end_warm_start()
                    self._end_prefill()
                    self._drop_ahead()  # made beside an opening that failed
                    self.local.resync([*self.prompt_ids, *self.out])
                    if not self._resync(exc):
                        self._lost(exc)
                    continue
                self.may_resync = True
                if self.warming is not None:  # the first Generalist token is in
                    self.warming.start()
                if self.resyncing:
                    self.resyncing = False
                    stats.resyncs += 1
            elif params.collaborative and not self.held \
                    and (back := self.links.poll()) is not None:
                if self._discloses(self.out):
                    back.close()
                    self._hold("leak guard: the local text holds private history")
                    continue
                self._go_remote(back)
                stats.reconnects += 1
                self._announce("collaborative", "companion is back")
                continue
            else:
                token, provenance = self._local_token(), "local"
                self.stats.leak_held += self.held
            yield self._emit(token, provenance)
            if token in self.eos:
                return
            if self.rules.ends(self.out):  # `params.loop_end_ngram`
                stats.loop_ended = True
                return

    def _go_remote(self, link: CompanionLink) -> None:
        """Collaborate over `link` from here: the public prompt plus every token so far."""
        self._hold_link(link)
        self._collaborate(link)

    def _hold_link(self, link: CompanionLink) -> None:
        """Use `link` from here: its waits end when the generation is cancelled."""
        link.cancel = self.cancel
        self.open_links.append(link)

    def _collaborate(self, link: CompanionLink, *, warm: bool = False) -> None:
        """(Re-)open the session on the public prompt plus every token so far; `warm`: as the
        LLM baseline (Generalist rows only; the device's track is not touched)."""
        method = "llm" if warm else self.params.method
        done = len(self.out)
        # the rules see the whole output (`self.rules`): only the budget left changes
        left = replace(self.params, method=method,
                       max_new_tokens=self.params.max_new_tokens - done)
        if warm or done:  # the draft made ahead starts right after the prompt
            self._drop_ahead()
        ahead, self.ahead = self.ahead, None
        self.remote = collaborate(
            self.specialist, self.local, list(self.prompt.public_ids), list(self.out), left, link,
            self.stats, self.rng, self.guard, self.next_round, ahead, rules=self.rules,
            ready=self._session_ready,
        )

    def _session_ready(self) -> MadeAhead | None:
        """The companion holds the session: note when, and let the rounds have the track, with
        what was made beside the opening, if anything (the track then holds its draft)."""
        if self.stats.session_ready_s is None:
            self.stats.session_ready_s = time.perf_counter() - self.started
        self._end_prefill()
        made, self.made = self.made, None
        return made

    def _first_round_then(self) -> Callable[[Track, Callable[[], bool]], MadeAhead] | None:
        """What a cold start's background prefill does next while the companion still opens
        the session (`rounds.make_ahead`): the first round's draft (the same greedy draft the
        first round would make after the opening, so the text does not change) and, with
        P_S0 asked on the device, P_S0's prefill of the public prompt (the companion then
        opens on the Generalist alone). None where neither applies or was made already."""
        params, rules = self.params, self.rules
        drafts = first_draft_key(params) is not None and self.ahead is None
        public = list(self.prompt.public_ids) \
            if s0_ahead_wanted(params) and self.made is None else None
        if not drafts and public is None:
            return None
        return lambda track, stop: make_ahead(self.specialist, track, params, rules, stop,
                                              drafts=drafts, public_ids=public)

    def _drop_ahead(self) -> None:
        """The draft made ahead (by prepare, or beside the opening) will not be used: the track
        holds the prompt alone again."""
        self._drop_made()
        if self.ahead is not None:
            self.ahead = None
            self.local.resync(self.prompt_ids)

    def _drop_made(self) -> None:
        """What was made beside the opening will not be used: P_S0's track is closed, and the
        device's track no longer holds the draft (no round ran, so nothing else follows the
        prompt)."""
        made, self.made = self.made, None
        if made is not None:
            made.close_s0()
            if made.draft is not None:
                self.local.resync(self.prompt_ids)

    def _resync(self, exc: Exception) -> bool:
        """The link dropped: rebuild the session on a fresh connection now, before any local
        token. False when that is not possible: not a dropped link (the companion refused,
        broke the protocol or stalled: a stall already cost a timeout, so the offline policy's
        background probes take over), no connection, or the last resync dropped again before
        it yielded a token."""
        dropped = isinstance(exc, CompanionUnavailable) and not isinstance(exc, CompanionTimedOut)
        if not (dropped and self.may_resync) or self.held:
            return False
        self.may_resync = False
        try:
            link = self.links.connect()
        except CompanionRefused:
            raise
        except LINK_ERRORS:
            return False
        if self._discloses(self.out):
            link.close()
            return False
        self._go_remote(link)
        self.resyncing = True
        return True

    def _hold(self, reason: str) -> None:
        """The leak guard held: finish on the device alone; nothing more is sent."""
        self._drop_remote()
        self._end_prefill()
        self.local.resync([*self.prompt_ids, *self.out])
        self.held = True
        self._announce("local", reason)

    def _discloses(self, resent: list[int]) -> bool:
        """Whether re-opening a session on the public prompt plus `resent` (tokens decoded
        locally, never checked) would send private history the guard is told to keep."""
        if self.guard is None or self.guard.policy == "allow":
            return False
        if self.guard.scan([], resent) is None:
            return False
        self.stats.leak_flagged += 1
        return True

    def _warm_start_wanted(self, link: CompanionLink | None) -> bool:
        params = self.params
        reachable = link is not None or self.links.connect_fn is not None
        pending = self.local.pending
        return (params.warm_start and params.method in MODES and reachable and pending > 0
                and estimated_prefill_s(self.specialist, pending) >= params.warm_start_min_s)

    def _overlap_wanted(self, link: CompanionLink | None) -> bool:
        """A cold collaborative start whose private prefill can run beside the session's
        opening: on a session whose passes release the GIL, with a companion to open."""
        reachable = link is not None or self.links.connect_fn is not None
        return (self.params.collaborative and self.params.method != "llm" and reachable
                and self.local.pending > 0 and isinstance(self.local.session, CancellableSession))

    def _end_prefill(self) -> None:
        """Wait for a cold start's background prefill (the track is the loop's again); what it
        made beside the opening waits for the session (`_drop_ahead` forgets it if no round
        takes it)."""
        if self.prefilling is not None:
            prefilling, self.prefilling = self.prefilling, None
            try:
                made = prefilling.join()
            finally:
                self.stats.prefill_s += prefilling.seconds
            self.made = made
            if made is not None and made.draft is not None:
                self.stats.drafted_beside_opening = len(made.draft.tokens)

    def _switch_due(self) -> bool:
        assert self.warming is not None
        if self.switch_after is not None:
            return len(self.out) >= self.switch_after
        return self.warming.done()

    def _end_warm_start(self) -> None:
        """Wait for the background prefill (the track is the loop's again)."""
        if self.warming is not None:
            warming, self.warming = self.warming, None
            warming.join()
            self.stats.prefill_s += warming.seconds

    def _switch(self) -> None:
        """The device is ready: append what the Generalist wrote, switch to the method."""
        self._end_warm_start()
        t0 = time.perf_counter()
        if self.out:
            self.local.extend(self.out)
        self.stats.device_s += time.perf_counter() - t0
        assert self.remote is not None  # going local ends the warm start first
        self.remote.close()  # type: ignore[attr-defined]
        self.next_round = self.open_links[-1].conn.round
        self._collaborate(self.open_links[-1])
        self.stats.warm_tokens = len(self.out)
        self.stats.switch_s = time.perf_counter() - self.started

    def _lost(self, exc: Exception) -> None:
        """The companion failed: raise, wait for it, or go local, as the policy says."""
        if self.policy.mode == "fail":
            raise exc
        if self.policy.mode == "wait":
            self._go_remote(self.links.wait(str(exc)))
            return
        self.stats.degraded = True
        self.stats.offline_reason = str(exc)
        self.links.went_local()
        self._announce("local", str(exc))

    def _drop_remote(self, background: bool = False) -> None:
        """Close the remote rounds and every open link (their sessions end with them);
        `background`: on a thread of its own, waited for at most `CLOSE_GRACE_S`."""
        if self.open_links:
            self.next_round = self.open_links[-1].conn.round
        self.resyncing = False
        if self.remote is not None:
            self.remote.close()  # type: ignore[attr-defined]
            self.remote = None
        links, self.open_links = self.open_links[::-1], []
        if not background:
            for link in links:
                link.close()
        elif links:
            closer = self.workers.start(lambda: [link.close() for link in links],
                                        "specsteer-close")
            closer.join(CLOSE_GRACE_S)

    def _local_token(self) -> int:
        """The Specialist alone (local methods, offline-degraded mode): one round per token."""
        t0 = time.perf_counter()
        row = self.rules.forbid(self.out, self.local.row)
        token = choose(row, self.params.temperature, self.rng)
        if token not in self.eos:
            self.local.push(token)
        self.stats.device_s += time.perf_counter() - t0
        self.stats.rounds += 1
        return token

    def _emit(self, token: int, provenance: str) -> TokenEvent:
        self.out.append(token)
        self.stats.tokens += token not in self.eos
        if self.stats.first_token_s is None:
            self.stats.first_token_s = time.perf_counter() - self.started
        return TokenEvent(token, provenance, self.stats.rounds)

    def _announce(self, mode: str, reason: str) -> None:
        if self.on_mode is not None:
            self.on_mode(ModeChange(mode, len(self.out), reason))
