"""`KeptTracks`: the Specialist's prefilled KV states a `Client` keeps between generations.

One `Track` per task, with the private prompt ids known to start its session. `prepare`
prefills a prompt on a background thread while the user is still typing; `take` hands the
track to a generation, stopping that prefill at its next chunk and rewinding the session to
the longest prefix it shares with the generation's prompt (exact rewind: an index move), so
only the rest is run; `give_back` keeps it for the next one. The task's static system part and
any records that stay retrieved are therefore prefilled once per model session.
`KeptSessions` does the same for the companion's side: the session over the public prompt,
opened ahead (hello and the companion's prefill) so that the first round can start at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specsteer.device.rounds import MadeAhead, session_settings
from specsteer.errors import GenerationCancelled
from specsteer.link import CANCEL_POLL_S, CompanionLink
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track, model_pace
from specsteer.settings import Params
from specsteer.workers import Workers

PREPARED_ROOM = 1024  # tokens a prepared session leaves after its prompt (generation + margin)
# makes the first round's draft (and P_S0's public track) after the prefill
# (`rounds.make_ahead`); the callable says when to stop early
MakeAhead = Callable[[Track, Callable[[], bool]], MadeAhead]


@dataclass
class _Kept:
    track: Track
    ids: list[int]  # the prompt this track holds or is prefilling
    stop: threading.Event = field(default_factory=threading.Event)
    worker: threading.Thread | None = None
    # what was made after the prefill, and the key of what its draft depends on
    ahead: tuple[object, MadeAhead] | None = None

    def drop_ahead(self) -> None:
        """Forget what was made ahead: the session holds the prompt again, with its row, and
        P_S0's track is closed."""
        if self.ahead is not None:
            made, self.ahead = self.ahead[1], None
            made.close_s0()
            if made.draft is not None:
                self.track.keep(made.draft.base, made.draft.rows[0])

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

    def __init__(self, model: LanguageModel, workers: Workers) -> None:
        self.model = model
        self.workers = workers  # the owner's (the Client's): it joins the prefills
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def prepare(self, task: str, ids: Sequence[int], then: MakeAhead | None = None,
                key: object = None) -> threading.Thread:
        """Start prefilling `ids` for `task` in the background; returns the prefill thread.
        `then`: after the prefill, draft the first round too and prefill P_S0's public track
        (`rounds.make_ahead`); `key` says what that draft depends on besides the prompt
        (`rounds.first_draft_key`)."""
        kept = self._checkout(task, ids, len(ids) + PREPARED_ROOM)
        kept.ids = list(ids)

        def run() -> None:
            # cancelled: a generation took the track and resumes the prefill itself
            with contextlib.suppress(GenerationCancelled):
                kept.track.prefill(kept.stop)
                if then is not None and not kept.stop.is_set():
                    kept.ahead = (key, then(kept.track, kept.stop.is_set))

        kept.worker = self.workers.thread(run, "specsteer-prepare")
        with self._lock:
            old = self._kept.pop(task, None)
            self._kept[task] = kept
        if old is not None and old is not kept:
            old.halt()
            old.track.close()
        kept.worker.start()
        return kept.worker

    def take(self, task: str, ids: Sequence[int], room: int, key: object = None
             ) -> tuple[Track, int, MadeAhead | None]:
        """A track holding (or pending) `ids` with room for `room` tokens, how many of them
        it kept from an earlier prefill, and what was made ahead when it was made for exactly
        `ids` and `key` (the track then holds its draft after the prompt; the caller owns
        P_S0's track); the caller gives the track back or closes it."""
        with self._lock:
            kept = self._kept.pop(task, None)
        if kept is not None:
            kept.halt()
            if (kept.ahead is not None and key is not None and kept.ahead[0] == key
                    and kept.ids == list(ids) and kept.track.max_length >= room):
                return kept.track, len(ids), kept.ahead[1]
        track = self._reuse(kept, ids, room).track
        return track, min(track.session.length, len(ids)), None

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
        return self._reuse(kept, ids, room)

    def _reuse(self, kept: _Kept | None, ids: Sequence[int], room: int) -> _Kept:
        """`kept` (halted) retargeted to `ids` when it has room, else a new track."""
        if kept is not None:
            kept.drop_ahead()
            if kept.track.max_length >= room and ids:
                kept.track.retarget(kept.held(), ids)
                return _Kept(kept.track, list(ids))
            kept.track.close()
        return _Kept(Track(self.model, ids, room, lazy=True, pace=model_pace(self.model)),
                      list(ids))

Connect = Callable[[threading.Event], CompanionLink]  # a new link whose waits end on the event


class OpeningSession:
    """A companion session opened on a thread for a prepared request's public prompt.

    The link's hello and the companion's prefill of the public prompt (its `OpenSession`) run
    while the user is still typing; `take` hands the link to the generation, which uses the
    session as it is when its public prompt and settings match (`CompanionLink.holds`) and
    replaces it on the same connection otherwise. Only the public prompt goes up, as in any
    generation. Nothing is left open: a session not taken is closed. `link`: an open link to
    use instead of a new connection (an earlier prepare's; its session is replaced, or kept
    when it already holds this one).
    """

    def __init__(self, connect: Connect, public_ids: Sequence[int], params: Params,
                 workers: Workers, link: CompanionLink | None = None) -> None:
        self.stop = threading.Event()
        self.workers = workers
        self._lock = threading.Lock()
        self._link: CompanionLink | None = None
        self._taken = False
        ids = list(public_ids)
        self._thread = workers.start(lambda: self._open(connect, ids, params, link),
                                     "specsteer-open")

    def _open(self, connect: Connect, public_ids: list[int], params: Params,
              link: CompanionLink | None) -> None:
        try:
            if link is None:
                link = connect(self.stop)
            link.cancel = self.stop
            settings = session_settings(params, link)
            if not link.holds(public_ids, settings):
                link.open(public_ids, settings)
        except BaseException:  # unreachable, refused, stopped: the generation connects itself
            if link is not None:
                link.close()
            return
        with self._lock:
            if self._taken:  # given up while opening
                link.close()
            else:
                self._link = link

    def done(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def take_if_open(self) -> CompanionLink | None:
        """The link if its opening is over and went well (the caller owns it), else None."""
        return self.take() if self.done(0) else None

    def take(self, cancel: threading.Event | None = None) -> CompanionLink | None:
        """The link once opening is over (None if it failed); the caller owns it. Raises
        `GenerationCancelled` (and gives the session up) when `cancel` is set meanwhile."""
        while not self.done(CANCEL_POLL_S):
            if cancel is not None and cancel.is_set():
                self.close()
                raise GenerationCancelled("cancelled while the prepared session opened")
        with self._lock:
            link, self._link, self._taken = self._link, None, True
        return link

    def close(self) -> None:
        """Give the session up: closed now if open, or as soon as its opening ends."""
        self.stop.set()
        with self._lock:
            link, self._link, self._taken = self._link, None, True
        if link is not None:  # a websocket close waits a round trip: not on the caller's time
            self.workers.start(link.close, "specsteer-close")


class KeptSessions:
    """The companion session `Client.prepare` opened per task (at most one each)."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers  # the owner's (the Client's): it joins openings and closes
        self._kept: dict[str, OpeningSession] = {}
        self._lock = threading.Lock()

    def prepare(self, task: str, connect: Connect, public_ids: Sequence[int],
                params: Params) -> OpeningSession:
        """Open a session for `public_ids`: on the connection an earlier prepare of the task
        opened, when it is open (no new hello), else on a new one."""
        with self._lock:
            old = self._kept.pop(task, None)
        link = old.take_if_open() if old is not None else None
        if old is not None and link is None:
            old.close()
        opening = OpeningSession(connect, public_ids, params, self.workers, link)
        with self._lock:
            other, self._kept[task] = self._kept.get(task), opening
        if other is not None:  # another thread prepared the task meanwhile
            other.close()
        return opening

    def take(self, task: str, cancel: threading.Event | None = None) -> CompanionLink | None:
        """The task's prepared link (the caller owns it), or None."""
        with self._lock:
            opening = self._kept.pop(task, None)
        return opening.take(cancel) if opening is not None else None

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for opening in kept:
            opening.close()
