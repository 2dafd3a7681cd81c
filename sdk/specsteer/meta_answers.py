"""Openings of a meta answer: text no user writes in their own name.

Asked to write a newsgroup follow-up without the thread, the Generalist (and a Specialist that
learned the same habit) answers about the request instead: "I'm sorry, but I can't assist with
that request", "As an AI language model, …", "Could you please provide more information …".
The decoder bans the token that would complete one of these phrases at the start of the output
(`device.rules.opening_bans`), so the model writes the text itself; measured on 20 newsgroup senders
(docs/BENCHMARKS.md). The phrases are English; an app writing in another language passes its
own as `Params.meta_openings`, `()` turns the rule off.

Assistant openings are the chat model's voice rather than the user's: "I'm glad you found the
thread helpful!", "I hope this post finds you well.", "Dear [Recipient's Name]", "Here's the
follow-up post:". Some people do write some of them, so each is banned only for a user whose
own retrieved texts never use it (`unused_phrases`; `Params.for_user`).

The same voice also shows after the opening ("… As an AI language model, I don't have personal
opinions", "If you have any other questions, feel free to ask!", markdown bold and code fences
in a newsgroup post): `ASSISTANT_PHRASES` are banned anywhere in the output, again only for a
user whose texts never use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


ASSISTANT_OPENINGS: tuple[str, ...] = (
    # whole phrases, not their first words: banning "I'm glad", "I hope this" and "Subject"
    # pushed the models to worse openings ("I'm here, and I'm ready to help you", "I hope you
    # found the information helpful. As an AI language model …"): SpecSteer −2.78 ROUGE-1 on
    # 20 newsgroup senders, against −1.28 (not significant) for this list (docs/BENCHMARKS.md)
    "I'm glad you", "I am glad you", "I'm so glad you",
    "I'm not sure what you", "I'm not sure if you", "I am not sure what you",
    "I'm not sure if I", "I'm here to help", "I'm happy to help",
    "I hope this message finds", "I hope this email finds", "I hope this post finds",
    "I hope this note finds", "I hope this finds", "I hope you're doing", "I hope you are doing",
    "I hope you're having", "I hope all is well", "I wanted to take a moment",
    "Thank you for reaching out", "Thank you for sharing", "Thanks for sharing",
    "Dear [", "Subject:", "Here's the", "Here is the", "Here's a", "Here is a",
    "I'm writing this", "I'm writing to", "I am writing to",
)


ASSISTANT_PHRASES: tuple[str, ...] = (
    # banned anywhere (the token completing the phrase), for a user who never writes them;
    # "As an AI" is cut at "AI", whatever follows ("language model", "assistant", ", I …")
    "As an AI", "as an AI", "As a language model", "as a language model", "I'm an AI",
    "feel free to ask", "Feel free to ask", "feel free to reach out", "Feel free to reach out",
    "don't hesitate to ask", "don't hesitate to reach out",
    "If you have any other questions", "If you have any further questions",
    "If you have any more questions", "if you have any other questions",
    "I hope this helps", "I hope this information", "I hope you find this",
    "I'm here to help", "I am here to help", "Here are some key points", "key points to consider",
    "**", "```",  # markdown bold and code fences: a chat answer's layout, not a post's
)


def unused_phrases(phrases: Sequence[str], texts: Iterable[str]) -> tuple[str, ...]:
    """The phrases that none of `texts` (the user's own) contains as words, case and
    apostrophe style as written ("Sure" is not found in "not sure")."""
    written = "\n".join(texts).replace("\u2019", "'")
    return tuple(p for p in phrases if not re.search(_as_words(p), written))


def _as_words(phrase: str) -> str:
    """A pattern for `phrase` not inside a longer word (at the ends that are word characters)."""
    pattern = re.escape(phrase.replace("\u2019", "'"))
    if phrase[:1].isalnum():
        pattern = r"(?<!\w)" + pattern
    if phrase[-1:].isalnum():
        pattern += r"(?!\w)"
    return pattern


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class PhraseIds:
    """Banned phrases as token ids: `openings` at the start of the output, `anywhere` at any
    position (each as written at a line's start and after a space: the same words are other
    tokens there)."""

    openings: tuple[tuple[int, ...], ...] = ()
    anywhere: tuple[tuple[int, ...], ...] = ()


def phrase_ids(tokenizer: _Encoder, openings: Sequence[str],
               anywhere: Sequence[str] = ()) -> PhraseIds:
    """`openings` and `anywhere` as the tokenizer writes them (once per generation: a few
    dozen short encodes, well under a millisecond)."""
    written = [text for phrase in anywhere for text in (phrase, " " + phrase)]
    return PhraseIds(_encoded(tokenizer, openings), _encoded(tokenizer, dict.fromkeys(written)))


def _encoded(tokenizer: _Encoder, phrases: Iterable[str]) -> tuple[tuple[int, ...], ...]:
    return tuple(ids for ids in (tuple(tokenizer.encode(p)) for p in phrases) if ids)
