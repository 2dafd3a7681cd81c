"""What a generation gives back: `Piece`s as they are decided, one `GenerationStats` and, at
the end, the `Result` — carried by the `Stream` that `Client.stream` returns (mlx-lm's
`stream_generate` responses are the model, docs/style.md).

The stats are one object composed of the layers' own counters: the decoding loop counts into
its `DecodeStats` part, every link of the generation into its `LinkStats` part, and the Client
adds the request's fields; nothing is copied. A new stat is one field in the layer that counts
it (the bridge's stats schema and the TypeScript types are generated from these fields).
This module owns no decoding and no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from specsteer.device.events import DecodeStats
from specsteer.history import Prompt
from specsteer.link import LinkStats
from specsteer.options import stat


@dataclass(frozen=True)
class Piece:
    """A streamed piece of text and the token that produced it."""

    text: str
    token: int
    provenance: str
    round: int


@dataclass
class GenerationStats(LinkStats, DecodeStats):
    """What one generation cost, as the device measured it: the loop's counters
    (`DecodeStats`), the links' (`LinkStats`: every reconnect counts into the same object)
    and the request's own, below."""

    method: str = stat("", "the decoding method")
    retrieval_s: float = stat(0.0, "seconds spent retrieving the history records")
    total_s: float = stat(0.0, "seconds from the request to the last token")
    prefill_reused: int = stat(
        0, "private prompt tokens whose state prepare or an earlier generation had already "
        "computed (exact rewind)")
    prefill_tokens: int = stat(0, "private prompt tokens this generation prefilled itself")
    prompt_tokens: int = stat(
        0, "tokens of the prompt the Specialist read (the private one; the public one for the "
        "SLM baseline): the OpenAI usage.prompt_tokens")
    records: tuple[str, ...] = stat((), "ids of the history records in the private prompt")
    truncated: tuple[str, ...] = stat((), "ids of the records cut to fit the prompt budget")

    # the measures derived from the fields, sent with them (`to_json`)
    DERIVED = {"acceptance_rate": "accepted / drafted tokens (0 with no draft)",
               "tokens_per_s": "tokens / total_s",
               "bytes_per_token": "(bytes_up + bytes_down) / tokens"}

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s if self.total_s else 0.0

    @property
    def bytes_per_token(self) -> float:
        return (self.bytes_up + self.bytes_down) / self.tokens if self.tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        """Every field and derived measure, JSON-ready (tuples as lists)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {**out, **{name: getattr(self, name) for name in self.DERIVED}}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


@dataclass
class Result:
    """A finished generation."""

    text: str
    tokens: list[int]
    provenance: list[str]
    stats: GenerationStats
    prompt: Prompt = field(repr=False)


class Stream:
    """One generation as it is written: iterate it for its `Piece`s. `stats` is the
    generation's `GenerationStats`, counted into as it goes; `result` is the whole generation
    once the stream has ended. `close()` (or leaving a `with` block) stops it: the decoder's
    sessions are closed and the Client keeps what it prefilled."""

    def __init__(self, pieces: Generator[Piece, None, Result], stats: GenerationStats) -> None:
        self._pieces = pieces
        self.stats = stats
        self._result: Result | None = None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Piece:
        try:
            return next(self._pieces)
        except StopIteration as end:
            if end.value is not None:
                self._result = end.value
            raise

    @property
    def result(self) -> Result:
        """The finished generation (text, tokens, provenance, stats, prompt)."""
        if self._result is None:
            raise RuntimeError("the stream has not ended: iterate it to its end first "
                               "(a stream closed early has no result)")
        return self._result

    def finish(self) -> Result:
        """Run the stream to its end and return its result."""
        for _ in self:
            pass
        return self.result

    def close(self) -> None:
        self._pieces.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
