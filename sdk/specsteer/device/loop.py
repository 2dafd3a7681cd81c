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

from specsteer.device.drafting import choose
from specsteer.device.events import DecodeStats, DevicePrompt, TokenEvent
from specsteer.device.offline import LINK_ERRORS, ModeChange, OfflinePolicy, Reconnector
from specsteer.device.rounds import collaborate
from specsteer.errors import GenerationCancelled
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
    cancel: threading.Event | None = None,
    local: Track | None = None,
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
    caller keeps one between generations (`specsteer.prepared`); it is not closed here.
    """
    generation = _Generation(
        specialist, prompt, params, stats, connect, offline, on_mode, cancel, local
    )
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
        cancel: threading.Event | None = None,
        local: Track | None = None,
    ) -> None:
        self.specialist, self.prompt, self.params = specialist, prompt, params
        self.cancel = cancel if cancel is not None else threading.Event()
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
        self.owns_local = local is None
        self.local = local if local is not None else \
            Track(specialist, self.prompt_ids, room, lazy=True)

    def run(self, link: CompanionLink | None) -> Iterator[TokenEvent]:
        try:
            yield from self._run(link)
        except GenerationCancelled:
            self.stats.cancelled = True
        finally:
            self._drop_remote()
            self.links.close()
            if self.owns_local:
                self.local.close()

    def _run(self, link: CompanionLink | None) -> Iterator[TokenEvent]:
        params, stats = self.params, self.stats
        if params.method != "llm":  # the LLM baseline needs the Specialist only if it goes offline
            self.local.prefill(self.cancel)
        stats.prefill_s += time.perf_counter() - self.started
        if params.collaborative:
            try:
                self._go_remote(link if link is not None else self.links.connect())
            except LINK_ERRORS as exc:
                self._lost(exc)
        while len(self.out) < params.max_new_tokens:
            if self.cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            if self.remote is not None:
                try:
                    token, provenance = next(self.remote)
                except StopIteration:
                    return
                except LINK_ERRORS as exc:
                    self._drop_remote()
                    self.local.resync([*self.prompt_ids, *self.out])
                    self._lost(exc)
                    continue
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

    def _go_remote(self, link: CompanionLink) -> None:
        """Collaborate over `link` from here: the public prompt plus every token so far."""
        self.open_links.append(link)
        left = replace(self.params, max_new_tokens=self.params.max_new_tokens - len(self.out))
        public = [*self.prompt.public_ids, *self.out]
        self.remote = collaborate(
            self.specialist, self.local, public, left, link, self.stats, self.rng
        )

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
