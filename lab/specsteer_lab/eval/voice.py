"""Each evaluated user's own writing, as the quality measures a user would feel need it.

Owns, per user of a run: the texts of their history that are their own words for the task (the
task's `own_text` of each record's answer, as the prompt builder sees them), the median length of
those texts in words, and their character n-gram profile, built once per run. `measure` turns
one output into the row fields `length_ratio` (output words over the user's median) and
`style_own`, `style_others`, `style_margin` (cosine of the output's profile with the user's
history, with the other users' histories of the same run on average, and the difference).
Loads no models; reads only the examples it is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from specsteer.history import prompts
from specsteer_lab.eval.data import Example
from specsteer_lab.quality import history_profile, median_words, profile_similarity


def own_texts(example: Example) -> list[str]:
    """The user's own words of each history record of the example's task kinds (non-blank)."""
    task = prompts.get_task(example.task)
    texts = [task.own_text(task.answer(record)) for record in example.records
             if record.kind in task.kinds]
    return [text for text in texts if text.strip()]


@dataclass(frozen=True)
class Voice:
    """One user's typical length and character n-gram profile."""

    median_words: float | None  # None when the history holds none of the user's own text
    profile: Counter[str]


class Voices:
    """The voices of all users of a run; the others of a user are the rest of them."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self.by_user: dict[str, Voice] = {}
        for example in examples:
            texts = own_texts(example)
            self.by_user[example.user] = Voice(
                median_words(texts) if texts else None, history_profile(texts)
            )

    def measure(self, user: str, text: str) -> dict[str, float | None]:
        """Length ratio and style similarity of `text` as written for `user` (None: unknown)."""
        voice = self.by_user.get(user)
        fields: dict[str, float | None] = dict.fromkeys(
            ("user_median_words", "length_ratio", "style_own", "style_others", "style_margin")
        )
        if voice is None:
            return fields
        if voice.median_words:
            fields["user_median_words"] = voice.median_words
            fields["length_ratio"] = len(text.split()) / voice.median_words
        others = [other.profile for name, other in self.by_user.items()
                  if name != user and other.profile]
        if voice.profile and others:
            style = profile_similarity(text, voice.profile, others)
            fields.update(style_own=style.own, style_others=style.others,
                          style_margin=style.margin)
        return fields
