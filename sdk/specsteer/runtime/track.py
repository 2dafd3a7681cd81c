"""`Track`: one model's KV session plus its logits row for the next position.

Every participant of a round holds such a pair: the device's Specialist with the private
prompt, its context-free copy (P_S0, on the device or in the companion) and the companion's
Generalist. Rolling a rejected draft back is an index move (`keep`), as in gpt-fast: the
session rewinds and the row of the new last position is put back from the rows already
computed, so no model pass is spent on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specsteer.runtime.base import LanguageModel, Session


class Track:
    """A session over `prompt` and the raw logits row that predicts the next token.

    lazy: prefill on first use, so a role that may never be needed (the Specialist under the
    LLM baseline, until the companion goes away) never pays for it.
    """

    def __init__(
        self, model: LanguageModel, prompt: Sequence[int], max_length: int, *, lazy: bool = False
    ) -> None:
        self.session: Session = model.new_session(max_length=max_length)  # type: ignore[call-arg]
        self._pending: list[int] | None = list(prompt)
        self._row: np.ndarray | None = None
        if not lazy:
            self.prefill()

    def prefill(self) -> None:
        """Run the prompt now if it has not run yet."""
        if self._pending is not None:
            self._row = self.session.append(self._pending)[-1]
            self._pending = None

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

    def push(self, token: int) -> np.ndarray:
        """Append one token; its row for the next position."""
        self.prefill()
        self._row = self.session.append([token])[-1]
        return self._row

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Append ids in one pass: the rows predicting each of them and the one after, [n+1, V]."""
        row = self.row
        if not ids:
            return row[None, :]
        rows = self.session.append(list(ids))
        self._row = rows[-1]
        return np.concatenate([row[None, :], rows])

    def keep(self, length: int, row: np.ndarray) -> None:
        """Hold only the first `length` tokens, whose next-position row is `row`."""
        self.prefill()
        self.session.rewind(length)
        self._row = row

    def resync(self, sequence: Sequence[int]) -> None:
        """Hold exactly `sequence` (prompt included): keep the common length, run the rest."""
        self._pending = None
        keep = min(self.session.length, len(sequence) - 1)
        self.session.rewind(keep)
        self._row = self.session.append(list(sequence[keep:]))[-1]

    def close(self) -> None:
        self.session.close()
