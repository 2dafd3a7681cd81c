"""`KeptTracks`: the Specialist's prefilled KV states a `Client` keeps between generations.

One `Track` per task, with the private prompt ids known to start its session. `prepare`
prefills a prompt on a background thread while the user is still typing; `take` hands the
track to a generation, stopping that prefill at its next chunk and rewinding the session to
the longest prefix it shares with the generation's prompt (exact rewind: an index move), so
only the rest is run; `give_back` keeps it for the next one. The task's static system part and
any records that stay retrieved are therefore prefilled once per model session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from specsteer.errors import GenerationCancelled
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track

PREPARED_ROOM = 1024  # tokens a prepared session leaves after its prompt (generation + margin)


@dataclass
class _Kept:
    track: Track
    ids: list[int]  # the prompt this track holds or is prefilling
    stop: threading.Event = field(default_factory=threading.Event)
    worker: threading.Thread | None = None

    def held(self) -> list[int]:
        """The ids known to be in the session: a prefilled (or partly prefilled) prompt."""
        return self.ids[: min(len(self.ids), self.track.session.length)]

    def halt(self) -> None:
        """Stop a background prefill at its next chunk boundary and wait for it."""
        if self.worker is not None:
            self.stop.set()
            self.worker.join()
            self.worker = None
            self.stop = threading.Event()


class KeptTracks:
    """Per-task prefilled Specialist tracks, safe to use from several threads."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def prepare(self, task: str, ids: Sequence[int]) -> threading.Thread:
        """Start prefilling `ids` for `task` in the background; returns the prefill thread."""
        kept = self._checkout(task, ids, len(ids) + PREPARED_ROOM)
        kept.ids = list(ids)

        def run() -> None:
            # cancelled: a generation took the track and resumes the prefill itself
            with contextlib.suppress(GenerationCancelled):
                kept.track.prefill(kept.stop)

        kept.worker = threading.Thread(target=run, name="specsteer-prepare", daemon=True)
        with self._lock:
            old = self._kept.pop(task, None)
            self._kept[task] = kept
        if old is not None and old is not kept:
            old.halt()
            old.track.close()
        kept.worker.start()
        return kept.worker

    def take(self, task: str, ids: Sequence[int], room: int) -> tuple[Track, int]:
        """A track holding (or pending) `ids` with room for `room` tokens, and how many of
        them it kept from an earlier prefill; the caller gives it back or closes it."""
        track = self._checkout(task, ids, room).track
        return track, track.session.length

    def give_back(self, task: str, track: Track, ids: Sequence[int]) -> None:
        """Keep `track`, whose session starts with `ids` (as far as it was prefilled)."""
        with self._lock:
            old = self._kept.pop(task, None)
            self._kept[task] = _Kept(track, list(ids))
        if old is not None:
            old.halt()
            old.track.close()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for entry in kept:
            entry.halt()
            entry.track.close()

    def _checkout(self, task: str, ids: Sequence[int], room: int) -> _Kept:
        """The task's kept track retargeted to `ids` (taken out of the store), or a new one."""
        with self._lock:
            kept = self._kept.pop(task, None)
        if kept is not None:
            kept.halt()
            if kept.track.max_length >= room and ids:
                kept.track.retarget(kept.held(), ids)
                return _Kept(kept.track, list(ids))
            kept.track.close()
        return _Kept(Track(self.model, ids, room, lazy=True), list(ids))
