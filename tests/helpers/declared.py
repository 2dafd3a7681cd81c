"""Real models whose tokenizer is declared to do one thing differently, so a test can name
what a model "writes" or where it "ends" without a mock of the model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Through:
    """Everything not overridden is the wrapped object's own."""

    base: object

    def __getattr__(self, name: str):
        return getattr(self.base, name)


@dataclass
class Writes(_Through):
    """The same tokenizer, which writes the phrase `text` as `ids` (the tiny tokenizer's
    decode does not round-trip, so a test names the ids of an opening directly)."""

    text: str
    ids: list[int]

    def encode(self, text: str, **kwargs) -> list[int]:
        return list(self.ids) if text == self.text else self.base.encode(text, **kwargs)


@dataclass
class StopsAt(_Through):
    """The same tokenizer with `extra` also treated as end-of-text."""

    extra: int

    @property
    def eos_ids(self) -> frozenset[int]:
        return frozenset({*self.base.eos_ids, self.extra})


@dataclass
class WithTokenizer(_Through):
    """A real model read through another tokenizer (`Writes`, `StopsAt`)."""

    tokenizer: object
