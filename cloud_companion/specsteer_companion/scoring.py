"""The seam between the companion's method and the engine that runs a model: scoring passes.

A round asks a model — the Generalist, or P_S0 when the companion hosts it — to append the
ids the device committed since the last round plus its draft, in one pass, and then reads
rows of that pass: row j predicts `ids[j]`, row n (n = len(ids)) the token after them. The
method (`verifier.py`, with the rules in `specsteer.steer`) needs, from rows `first`..n only:
the log-probability of each id (`Scores.taken`: the ratio test), the top-k of one row (recovery,
the bonus, ROWS mode) and the log-probabilities of given ids at one row (P_S0 at the
Generalist's candidates). Then it keeps the accepted prefix (`ScoringSession.keep`).

Two engines implement it:
- `TrackScoring` (here): a `specsteer.runtime` model — ONNX Runtime, the embedded default, with
  or without cross-session batching — whose passes return whole rows (`whole_rows`: the
  "difference" selection and mismatched tokenizers need them);
- `specsteer_companion.vllm_engine.VllmScoring`: a vLLM engine (continuous batching, a paged
  prefix cache, GPUs), which returns the top-k and asked-for ids of a row, never a whole one.
Neither sees anything but the public prompt and the tokens of the generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from specsteer import steer
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer.tokenizer import Tokenizer


class Scores(Protocol):
    """What one scoring pass can tell about its rows `first`..n."""

    def taken(self) -> np.ndarray:
        """float32 [n - first]: log P(ids[j]) at row j, for j = first..n-1."""
        ...

    def top(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely ids at `row` (best first, ties to the lowest id) and their logp."""
        ...

    def at(self, row: int, ids: np.ndarray) -> np.ndarray:
        """float32 log-probabilities of `ids` at `row`."""
        ...

    def whole(self, row: int) -> np.ndarray:
        """The whole log-probability row (engines with `whole_rows` only)."""
        ...


class ScoringSession(Protocol):
    """One device session's token sequence on one model."""

    def score(self, ids: Sequence[int], first: int, top_k: int) -> Scores:
        """Append `ids` in one pass; rows `first`..n may be read, with top-k up to `top_k`."""
        ...

    def keep(self, advance: int) -> None:
        """Hold what was held before the last `score` plus its first `advance` ids, no more."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class ScoringModel(Protocol):
    """A model as the companion's verifier uses it: identity plus scoring sessions."""

    name: str
    sha256: str
    vocab_size: int
    context_length: int
    tokenizer: Tokenizer
    whole_rows: bool  # the engine can return whole rows (not only top-k and asked-for ids)
    max_top_k: int  # the most candidates a row can give

    def open(self, prompt: Sequence[int], *, max_length: int, temperature: float,
             owner: str = "") -> ScoringSession:
        """A session holding `prompt` (prefilled, or cached by the engine).

        temperature: the scale of the log-probabilities (> 0). owner: who the session is for
        (the device's identity): an engine that shares a cache between sessions keeps owners
        apart, so one device cannot time another's prompts through it.
        """
        ...


class TrackScores:
    """A pass of an engine that returns whole rows: everything is read from them."""

    def __init__(self, ids: Sequence[int], first: int, logp: np.ndarray) -> None:
        self.ids, self.first, self.logp = list(ids), first, logp

    def taken(self) -> np.ndarray:
        rows = np.arange(self.first, len(self.ids))
        if not rows.size:
            return np.zeros(0, np.float32)
        return self.logp[rows, [self.ids[j] for j in rows]]

    def top(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = steer.top_k_ids(self.logp[row], k)
        return ids, self.logp[row][ids]

    def at(self, row: int, ids: np.ndarray) -> np.ndarray:
        return self.logp[row][np.asarray(ids, dtype=np.int64)]

    def whole(self, row: int) -> np.ndarray:
        return self.logp[row]


class TrackSession:
    """A `Track` (KV session + next row) read as scoring passes."""

    def __init__(self, model: LanguageModel, prompt: Sequence[int], max_length: int,
                 temperature: float) -> None:
        self.track = Track(model, prompt, max_length)
        self.length = len(prompt)
        self.temperature = temperature
        self._raw: np.ndarray | None = None  # the last pass's raw rows, for `keep`

    def score(self, ids: Sequence[int], first: int, top_k: int) -> TrackScores:
        self._raw = self.track.extend(list(ids))
        return TrackScores(ids, first, steer.log_softmax(self._raw, self.temperature))

    def keep(self, advance: int) -> None:
        assert self._raw is not None, "keep() follows a score()"
        self.length += advance
        self.track.keep(self.length, self._raw[advance])
        self._raw = None

    def close(self) -> None:
        self.track.close()


class TrackScoring:
    """A `specsteer.runtime` model (ONNX Runtime, plain or batching) as a `ScoringModel`."""

    whole_rows = True

    def __init__(self, model: LanguageModel, max_top_k: int = 1024) -> None:
        self.model = model
        self.name, self.sha256 = model.name, model.sha256
        self.vocab_size, self.context_length = model.vocab_size, model.context_length
        self.tokenizer = model.tokenizer
        self.max_top_k = max_top_k

    def open(self, prompt: Sequence[int], *, max_length: int, temperature: float,
             owner: str = "") -> TrackSession:
        return TrackSession(self.model, prompt, max_length, temperature)


def scoring(model: LanguageModel | ScoringModel) -> ScoringModel:
    """`model` as a `ScoringModel`: engines are one already, runtime models get a Track."""
    if isinstance(model, ScoringModel):
        return model
    return TrackScoring(model)
