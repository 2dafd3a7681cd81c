"""`decode`: one generation on the device, collaborative while it can be, local when it must.

A generator of `TokenEvent`s (token id + provenance), like mlx-lm's generate_step: no text,
no I/O of its own; the companion is reached only through a `CompanionLink`, the rounds live in
`device.rounds` and the offline policy in `device.offline`. What goes up: public prompt ids,
drafted ids, and (only with `s0_on_device`) the context-free Specialist's log-probabilities of
the drafts. Never the private prompt, never P_Sc.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from specsteer.device.drafting import choose
from specsteer.device.events import DecodeStats, DevicePrompt, TokenEvent
from specsteer.device.offline import LINK_ERRORS, ModeChange, OfflinePolicy, Reconnector
from specsteer.device.rounds import collaborate
from specsteer.errors import CompanionTimedOut, CompanionUnavailable
from specsteer.link import CompanionLink
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer.settings import Params


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
    on failure). A link that drops mid-generation is first replaced at once by a fresh one from
    `connect` (the same or another companion), on which a `Resume` rebuilds the session from
    the public prompt, the tokens committed so far, the settings and the round counter; the
    greedy output is the uninterrupted one and `stats.resyncs` counts it. When that fails too,
    or the companion is unreachable or refuses, `offline` decides: with "degrade" the tokens
    come from the local Specialist (provenance "local"), `stats.degraded` is set, and `connect`
    is retried with backoff; a reconnect resumes the session the same way and collaboration
    goes on in the same generation.
    """
    generation = _Generation(specialist, prompt, params, stats, connect, offline, on_mode)
    yield from generation.run(link)


class _Generation:
    """The state of one `decode` call: tokens so far, the local track, the remote rounds."""

    def __init__(
        self,
        specialist: LanguageModel,
        prompt: DevicePrompt,
        params: Params,
        stats: DecodeStats | None,
        connect: Callable[[], CompanionLink] | None,
        offline: OfflinePolicy | str,
        on_mode: Callable[[ModeChange], None] | None,
    ) -> None:
        self.specialist, self.prompt, self.params = specialist, prompt, params
        self.stats = stats if stats is not None else DecodeStats()
        self.policy = OfflinePolicy.parse(offline)
        self.links = Reconnector(self.policy, connect)
        self.on_mode = on_mode
        self.eos = specialist.tokenizer.eos_ids
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
        self.local = Track(specialist, self.prompt_ids, room, lazy=True)

    def run(self, link: CompanionLink | None) -> Iterator[TokenEvent]:
        params, stats = self.params, self.stats
        if params.method != "llm":  # the LLM baseline needs the Specialist only if it goes offline
            self.local.prefill()
        stats.prefill_s += time.perf_counter() - self.started
        try:
            if params.collaborative:
                try:
                    self._go_remote(link if link is not None else self.links.connect())
                except LINK_ERRORS as exc:
                    self._lost(exc)
            while len(self.out) < params.max_new_tokens:
                if self.remote is not None:
                    try:
                        token, provenance = next(self.remote)
                    except StopIteration:
                        return
                    except LINK_ERRORS as exc:
                        self._drop_remote()
                        self.local.resync([*self.prompt_ids, *self.out])
                        if not self._resync(exc):
                            self._lost(exc)
                        continue
                    self.may_resync = True
                    if self.resyncing:
                        self.resyncing = False
                        stats.resyncs += 1
                elif params.collaborative and (back := self.links.poll()) is not None:
                    self._go_remote(back)
                    stats.reconnects += 1
                    self._announce("collaborative", "companion is back")
                    continue
                else:
                    token, provenance = self._local_token(), "local"
                yield self._emit(token, provenance)
                if token in self.eos:
                    return
        finally:
            self._drop_remote()
            self.links.close()
            self.local.close()

    def _go_remote(self, link: CompanionLink) -> None:
        """Collaborate over `link` from here: the public prompt plus every token so far (a
        `Resume` once there are any)."""
        self.open_links.append(link)
        left = replace(self.params, max_new_tokens=self.params.max_new_tokens - len(self.out))
        self.remote = collaborate(
            self.specialist, self.local, list(self.prompt.public_ids), list(self.out), left, link,
            self.stats, self.rng, self.next_round,
        )

    def _resync(self, exc: Exception) -> bool:
        """The link dropped: rebuild the session on a fresh connection now, before any local
        token. False when that is not possible: not a dropped link (the companion refused,
        broke the protocol or stalled: a stall already cost a timeout, so the offline policy's
        background probes take over), no connection, or the last resync dropped again before
        it yielded a token."""
        dropped = isinstance(exc, CompanionUnavailable) and not isinstance(exc, CompanionTimedOut)
        if not (dropped and self.may_resync):
            return False
        self.may_resync = False
        try:
            link = self.links.connect()
        except LINK_ERRORS:
            return False
        self._go_remote(link)
        self.resyncing = True
        return True

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

    def _drop_remote(self) -> None:
        if self.open_links:
            self.next_round = self.open_links[-1].conn.round
        self.resyncing = False
        if self.remote is not None:
            self.remote.close()  # type: ignore[attr-defined]
            self.remote = None
        while self.open_links:
            self.open_links.pop().close()

    def _local_token(self) -> int:
        """The Specialist alone (local methods, offline-degraded mode): one round per token."""
        t0 = time.perf_counter()
        token = choose(self.local.row, self.params.temperature, self.rng)
        if token not in self.eos:
            self.local.push(token)
        self.stats.device_s += time.perf_counter() - t0
        self.stats.rounds += 1
        return token

    def _emit(self, token: int, provenance: str) -> TokenEvent:
        self.out.append(token)
        self.stats.tokens += 1
        if self.stats.first_token_s is None:
            self.stats.first_token_s = time.perf_counter() - self.started
        return TokenEvent(token, provenance, self.stats.rounds)

    def _announce(self, mode: str, reason: str) -> None:
        if self.on_mode is not None:
            self.on_mode(ModeChange(mode, len(self.out), reason))
