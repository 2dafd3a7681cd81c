"""Openings of a meta answer: text no user writes in their own name.

Asked to write a newsgroup follow-up without the thread, the Generalist (and a Specialist that
learned the same habit) answers about the request instead: "I'm sorry, but I can't assist with
that request", "As an AI language model, …", "Could you please provide more information …".
The decoder bans the token that would complete one of these phrases at the start of the output
(`steer.opening_bans`), so the model writes the text itself; measured on 20 newsgroup senders
(docs/BENCHMARKS.md). The phrases are English; an app writing in another language passes its
own as `Params.meta_openings`, `()` turns the rule off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

META_OPENINGS: tuple[str, ...] = (
    "I'm sorry", "I am sorry", "I’m sorry", "Sorry,", "I apologize", "I apologise",
    "As an AI", "As a language model", "I'm an AI", "I am an AI",
    "I can't assist", "I cannot assist", "I can't help", "I cannot help",
    "I can't provide", "I cannot provide", "I'm unable", "I am unable", "I’m unable",
    "I'm not able", "I am not able", "I'm afraid", "I’m afraid", "Unfortunately, I",
    "I don't have access", "I do not have access", "I don't have the specific",
    "I don't have the ability", "I don't have personal", "Could you please provide",
    "Could you provide", "Please provide",
)


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def opening_ids(tokenizer: _Encoder, phrases: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each phrase as the tokenizer writes it at the start of a text (once per generation:
    a few dozen short encodes, well under a millisecond)."""
    return tuple(ids for ids in (tuple(tokenizer.encode(p)) for p in phrases) if ids)
