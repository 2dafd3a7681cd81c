"""Drafting on the device: the Specialist proposes up to K tokens from its private view.

A draft is cut short when a stop condition fires (the companion's verdict arrived while the
device was betting on the next round), and such a cut draft can be continued later, so that
where a round's draft ends never depends on timing. On the device's runtime the condition also
ends the pass in flight (`Track.push`): the verdict is read when it lands, not up to a pass
later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specsteer import steer
from specsteer.device.rules import Rules
from specsteer.errors import GenerationCancelled
from specsteer.runtime.track import Track
from specsteer.settings import Params


def choose(row: np.ndarray, temperature: float, rng: np.random.Generator | None) -> int:
    """The Specialist's own next token: argmax, or a sample at `temperature`."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(row))
    return steer.sample_index(np.exp(steer.log_softmax(row, temperature)), rng)


@dataclass
class Drafted:
    """One round's draft: tokens, the Specialist rows predicting each and the one after."""

    base: int  # session length before the first drafted token
    tokens: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    step_s: float | None = None  # seconds per drafted token (feeds the adaptive K)
    # the last token is chosen but not yet in the session (`draft(last_pending=True)`): its
    # row (the bonus position's) is computed by `settle`, after the draft has left
    pending: bool = False

    def settle(self, local: Track) -> None:
        """Append the pending last token to `local`: the row after it joins `rows`."""
        if self.pending:
            self.pending = False
            self.rows.append(local.push(self.tokens[-1]))


class _Fired:
    """A `stop` condition as the flag a pass watches (`runtime.base.Flag`)."""

    def __init__(self, stop: Callable[[], bool]) -> None:
        self.stop = stop

    def is_set(self) -> bool:
        return self.stop()


def budget(params: Params, k: int, produced: int) -> int:
    """Draft length (at most k) that leaves room for the round's recovered/bonus token."""
    return max(0, min(k, params.max_new_tokens - produced - 1))


def draft(
    local: Track,
    k: int,
    temperature: float,
    rng: np.random.Generator | None,
    eos: frozenset[int],
    stop: Callable[[], bool] | None = None,
    into: Drafted | None = None,
    rules: Rules | None = None,
    written: Sequence[int] = (),
    cancel: threading.Event | None = None,
    last_pending: bool = False,
) -> Drafted:
    """Draft up to k tokens (`stop` cuts it short), or continue the draft `into` up to k.

    An end-of-text draft is not appended to the session: nothing follows it. `rules` ban, at
    each drafted token, what may not follow the output so far: `written` (the generation's
    output before this draft) and the tokens drafted (`device.rules`). `cancel`, once set,
    raises `GenerationCancelled` before the next token (a draft of K tokens takes K model
    passes). `last_pending`: the k-th token is chosen but left `pending`, so the draft can
    leave one model pass sooner (the pass for the row after it runs while the companion
    verifies: `Drafted.settle`). The first token's pass always runs; `stop` may end any
    later one mid-way, and the draft then ends before that pass's token.
    """
    drafted = into if into is not None else Drafted(local.length, [], [local.row])
    started = done = time.perf_counter()
    passes = 0
    fired = () if stop is None else (_Fired(stop), *(() if cancel is None else (cancel,)))
    while len(drafted.tokens) < k and not (drafted.tokens and drafted.tokens[-1] in eos):
        if stop is not None and drafted.tokens and stop():
            break
        if cancel is not None and cancel.is_set():
            raise GenerationCancelled("cancelled while drafting")
        row = drafted.rows[-1]
        if rules is not None:
            row = rules.forbid([*written, *drafted.tokens], row)
        token = choose(row, temperature, rng)
        drafted.tokens.append(token)
        if token in eos:
            break
        if last_pending and len(drafted.tokens) == k:
            drafted.pending = True
            break
        try:
            row = local.push(token, *(fired if len(drafted.tokens) > 1 else ()))
        except GenerationCancelled:
            if stop is None or (cancel is not None and cancel.is_set()) or not stop():
                raise
            drafted.tokens.pop()  # its pass was stopped: a later draft(into=) redoes it
            break
        drafted.rows.append(row)
        passes += 1
        done = time.perf_counter()
    if passes:
        drafted.step_s = (done - started) / passes
    return drafted
