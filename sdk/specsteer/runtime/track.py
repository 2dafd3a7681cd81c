"""`Track`: one model's KV session plus its logits row for the next position.

Every participant of a round holds such a pair: the device's Specialist with the private
prompt, its context-free copy (P_S0, on the device or in the companion) and the companion's
Generalist. Rolling a rejected draft back is an index move (`keep`), as in gpt-fast: the
session rewinds and the row of the new last position is put back from the rows already
computed, so no model pass is spent on it. The prompt is prefilled in chunks with a
cancellation check between chunks; what a cancelled prefill already ran stays in the session
and the rest stays pending, so a later `prefill` resumes it. On a `CancellableSession` (the
device's runtime, `load_device_model`) a cancel also stops the chunk in flight, so chunks are a
fixed size (`STOPPABLE_CHUNK`): where they fall never depends on timing, and neither does the
text (chunk boundaries change logits by float rounding). Elsewhere a cancel waits for the
chunk in flight, so a prefill that must stop quickly there paces its chunks (`PrefillPace`):
each lasts about `PACED_CHUNK_S` whatever the CPU, at the price of text that can depend on
timing on a near-tie.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence

import numpy as np

from specsteer.errors import GenerationCancelled
from specsteer.runtime.base import CancellableSession, Flag, LanguageModel, Session

PREFILL_CHUNK = 128  # tokens per prefill pass (unpaced), and the most a paced pass runs
# tokens per pass of a prefill that a cancel stops mid-pass (`CancellableSession`): a
# terminate is checked between graph nodes, so the longest node bounds a cancel. That was the
# output layer over every position (Qwen2.5-0.5B: 128 x 151,936 x 896 = 17 G multiply-adds,
# 0.16-0.23 s on one core); a prefill pass now computes it for its last row alone, and larger
# passes gain little (w8a8, one core, per CPU second: 205 tokens/s at 64, 210 at 128, 222 at
# 256; docs/BENCHMARKS.md "Prefill at the limit"), so the passes stay 64 tokens, the same
# float rounding as before
STOPPABLE_CHUNK = 64
PACED_CHUNK_S = 0.1  # seconds a paced pass aims at: a cancel may take 200 ms in all
# tokens of a paced pass before any rate is known, and the fewest it runs: small passes cost
# throughput fast (Qwen2.5-0.5B int8, one core: 8-token passes 0.55-0.73x the tokens/s of
# 128-token ones, 12-token 0.78x, 16-token 0.88-0.93x; docs/BENCHMARKS.md "Latency");
# 16-token passes took up to 0.24 s on the shared benchmark machine, over the 200 ms bound
PACED_FIRST = 12


class PrefillPace:
    """How many tokens the next prefill pass runs so that it lasts about `seconds`.

    Sized from the tokens/s of the last pass on this model (shared by every track that uses
    this pace), within [`low`, `high`]. Small passes cost throughput (weights are read once
    per pass), so the pace is used where a cancel must land quickly: the device's prefill.
    """

    def __init__(self, seconds: float = PACED_CHUNK_S, low: int = PACED_FIRST,
                 high: int = PREFILL_CHUNK) -> None:
        if seconds <= 0 or not 1 <= low <= high:
            raise ValueError("need seconds > 0 and 1 <= low <= high")
        self.seconds, self.low, self.high = seconds, low, high
        self.rate: float | None = None  # tokens/s of the last pass

    def size(self) -> int:
        if self.rate is None:
            return self.low
        return max(self.low, min(self.high, int(self.rate * self.seconds)))

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.rate = tokens / seconds


_PACES: weakref.WeakKeyDictionary[object, PrefillPace] = weakref.WeakKeyDictionary()
_PACES_BY_ID: dict[int, PrefillPace] = {}  # models that cannot be hashed (value dataclasses)
_PACES_LOCK = threading.Lock()


def model_pace(model: LanguageModel) -> PrefillPace:
    """The model's shared `PrefillPace` (its last measured rate sizes every paced prefill).

    An unhashable model is keyed by its id: should a later model reuse it, it starts from
    the old rate, which its first pass corrects."""
    with _PACES_LOCK:
        try:
            return _PACES.setdefault(model, PrefillPace())
        except TypeError:
            return _PACES_BY_ID.setdefault(id(model), PrefillPace())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Track:
    """A session over `prompt` and the raw logits row that predicts the next token.

    lazy: prefill on first use, so a role that may never be needed (the Specialist under the
    LLM baseline, until the companion goes away) never pays for it.
    chunk: tokens per prefill pass; pace: size each pass by time instead (the device's
    prefill, which a cancel must be able to stop within ~`pace.seconds`).
    """

    def __init__(
        self,
        model: LanguageModel,
        prompt: Sequence[int],
        max_length: int,
        *,
        lazy: bool = False,
        chunk: int = PREFILL_CHUNK,
        pace: PrefillPace | None = None,
    ) -> None:
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        self.session: Session = model.new_session(max_length=max_length)  # type: ignore[call-arg]
        self.max_length = max_length
        self.chunk = chunk
        self.pace = pace
        self._pending: list[int] | None = list(prompt)
        self._row: np.ndarray | None = None
        self._row_at = -1  # the session length `_row` was computed at
        if not lazy:
            self.prefill()

    @property
    def pending(self) -> int:
        """Prompt tokens not prefilled yet."""
        return len(self._pending) if self._pending is not None else 0

    def prefill(self, *cancel: threading.Event | None) -> None:
        """Run what is left of the prompt now, a chunk per pass (`chunk` tokens, or paced).

        Raises `GenerationCancelled` at a chunk boundary once any `cancel` event is set; the
        chunks already run stay in the session and `prefill` resumes from there.
        """
        cancellable = isinstance(self.session, CancellableSession)
        stoppable = cancellable and any(event is not None for event in cancel)
        while self._pending:
            if any(event is not None and event.is_set() for event in cancel):
                raise GenerationCancelled("prefill cancelled")
            if stoppable:  # a cancel lands mid-pass: fixed passes, sized by no clock
                part = self._pending[: min(self.chunk, STOPPABLE_CHUNK)]
                self._set_row(self._last_row(part, cancel))
            else:
                part = self._pending[: self.pace.size() if self.pace is not None else self.chunk]
                started = time.perf_counter()
                self._set_row(self._last_row(part) if cancellable
                              else self.session.append(part)[-1])
                if self.pace is not None:
                    self.pace.observe(len(part), time.perf_counter() - started)
            self._pending = self._pending[len(part):]
        self._pending = None

    def _last_row(self, ids: Sequence[int], cancel: Sequence[Flag | None] = ()) -> np.ndarray:
        """Append `ids` to a `CancellableSession`: the logits of the last position only."""
        return self.session.append_cancellable(ids, cancel, rows=1)[-1]  # type: ignore[attr-defined]

    def retarget(self, held: Sequence[int], prompt: Sequence[int]) -> int:
        """Hold `prompt` (pending, run by the next `prefill`), keeping the longest prefix it
        shares with `held`, the ids known to start the session; returns the tokens kept.

        At least the prompt's last token is run again, so its next-position row is fresh,
        unless the session holds exactly `prompt`, fully prefilled: its row is that one.
        """
        if (self._pending is None and self._row is not None and prompt
                and self._row_at == self.session.length == len(prompt)
                and list(held) == list(prompt)):
            return len(prompt)
        keep = min(common_prefix(held, prompt), len(prompt) - 1, self.session.length)
        keep = max(keep, 0)
        self.session.rewind(keep)
        self._pending = list(prompt[keep:])
        self._row = None
        return keep

    def _set_row(self, row: np.ndarray) -> None:
        self._row, self._row_at = row, self.session.length

    @property
    def row(self) -> np.ndarray:
        """Logits [V] for the position after everything held."""
        self.prefill()
        assert self._row is not None
        return self._row

    @property
    def length(self) -> int:
        """Tokens held, the prompt included (prefills it first)."""
        self.prefill()
        return self.session.length

    def push(self, token: int, *stop: Flag) -> np.ndarray:
        """Append one token; its row for the next position. On a `CancellableSession` a
        `stop` flag set during the pass ends it there (`GenerationCancelled`, the track as it
        was); elsewhere the pass runs to its end."""
        self.prefill()
        if stop and isinstance(self.session, CancellableSession):
            self._set_row(self._last_row([token], stop))
        else:
            self._set_row(self.session.append([token])[-1])
        return self._row

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Append ids in one pass: the rows predicting each of them and the one after, [n+1, V]."""
        row = self.row
        if not ids:
            return row[None, :]
        rows = self.session.append(list(ids))
        self._set_row(rows[-1])
        return np.concatenate([row[None, :], rows])

    def keep(self, length: int, row: np.ndarray) -> None:
        """Hold only the first `length` tokens, whose next-position row is `row`."""
        self.prefill()
        self.session.rewind(length)
        self._set_row(row)

    def resync(self, sequence: Sequence[int]) -> None:
        """Hold exactly `sequence` (prompt included): keep the common length, run the rest."""
        self._pending = None
        keep = min(self.session.length, len(sequence) - 1)
        self.session.rewind(keep)
        rest = list(sequence[keep:])
        self._set_row(self._last_row(rest) if isinstance(self.session, CancellableSession)
                      else self.session.append(rest)[-1])

    def close(self) -> None:
        self.session.close()
