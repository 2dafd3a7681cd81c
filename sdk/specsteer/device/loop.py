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
from specsteer.device.leak_guard import LeakGuard, LeakHeld
from specsteer.device.offline import LINK_ERRORS, ModeChange, OfflinePolicy, Reconnector
from specsteer.device.rounds import collaborate
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
    guard: LeakGuard | None = None,
) -> Iterator[TokenEvent]:
    """Yield generated tokens for `prompt` with `params.method`; stops at end-of-text.

    `link` is an open companion link, or None with `connect` a factory of new ones (it raises
    on failure). When the companion is unreachable or fails, `offline` decides: with "degrade"
    the tokens come from the local Specialist (provenance "local"), `stats.degraded` is set, and
    `connect` is retried with backoff; a reconnect re-opens the session on the public prompt
    plus everything committed so far and collaboration resumes in the same generation.

    `guard` checks what leaves (`params.leak_guard`); by default it is built from the prompt's
    two views. Pass one built over more private text (e.g. the whole history) to guard that too.
    """
    generation = _Generation(specialist, prompt, params, stats, connect, offline, on_mode, guard)
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
        guard: LeakGuard | None = None,
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
        self.started = time.perf_counter()
        # the SLM baseline reads the public prompt; every other method the private one
        self.prompt_ids = list(prompt.private_ids if params.method != "slm" else prompt.public_ids)
        room = len(self.prompt_ids) + params.max_new_tokens + 64
        self.local = Track(specialist, self.prompt_ids, room, lazy=True)
        self.guard = guard if guard is not None or not params.collaborative else LeakGuard(
            specialist.tokenizer, prompt.private_ids, prompt.public_ids,
            policy=params.leak_guard, n=params.leak_guard_n,
        )
        self.held = False  # the leak guard stopped collaboration for the rest of the generation

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
                    except LeakHeld as held:
                        self._hold(str(held))
                        continue
                    except LINK_ERRORS as exc:
                        self._drop_remote()
                        self.local.resync([*self.prompt_ids, *self.out])
                        self._lost(exc)
                        continue
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
        finally:
            self._drop_remote()
            self.links.close()
            self.local.close()

    def _go_remote(self, link: CompanionLink) -> None:
        """Collaborate over `link` from here: the public prompt plus every token so far."""
        self.open_links.append(link)
        left = replace(self.params, max_new_tokens=self.params.max_new_tokens - len(self.out))
        public = [*self.prompt.public_ids, *self.out]
        self.remote = collaborate(
            self.specialist, self.local, public, left, link, self.stats, self.rng, self.guard,
            list(self.out),
        )

    def _hold(self, reason: str) -> None:
        """The leak guard held: finish on the device alone; nothing more is sent."""
        self._drop_remote()
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
