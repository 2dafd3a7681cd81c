"""The text rules of one generation, as small composable processors (mlx-lm's
`logits_processors`, docs/style.md): which tokens the output may not continue with, and when a
looping text ends.

Each rule is a function of the output so far (and, for an early end, of the deciding model's row)
made by a factory from the frozen `Params`; `make_rules` composes the ones a generation's settings
turn on, once per generation, with the banned phrases spelt by the Specialist's tokenizer. The
decoding code asks that one `Rules` object at every position (`banned`, `forbid`, `without`,
`ends`): the drafts, the recovery after a verdict, the per-token baselines and the local tokens
apply the same rules the same way. A rule sees the whole output of the generation, so its
position is the output's length (a session resumed mid-generation needs no shifted settings).
Rules run on the device only and send nothing; they never read the prompt, so the user's own
phrases stay reachable. The method itself (ratio test, fusion) is `steer.py`'s.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specsteer.meta_answers import phrase_ids
from specsteer.settings import Params
from specsteer.steer import SparseSteer, log_softmax_wide
from specsteer.tokenizer import Tokenizer

# A rule: (output so far, the deciding model's row, its ids or None) -> ids the next token may
# not be. The row is logits over the vocabulary (ids None) or log-probabilities of `ids`.
Ban = Callable[[Sequence[int], np.ndarray, "np.ndarray | None"], frozenset[int]]

# a token that ends a sentence: its text ends in . ! or ? (maybe closing a quote or bracket),
# or holds a line break
SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s*$|\n")
NOTHING: frozenset[int] = frozenset()


# --------------------------------------------------------------------------- the rules' maths


def end_probability(
    row: np.ndarray, eos: frozenset[int], ids: np.ndarray | None = None
) -> float:
    """Probability that the text ends here: the mass of `eos` under `row`, which is either
    logits over the whole vocabulary (`ids` None) or the log-probabilities of `ids` (the
    companion's top-k, where an id outside them counts as 0)."""
    if ids is None:
        logp = log_softmax_wide(np.asarray(row))
        mass = np.exp(logp[np.fromiter(eos, dtype=np.int64)]).sum()
    else:
        mass = np.exp(np.asarray(row)[np.isin(ids, list(eos))]).sum()
    return min(float(mass), 1.0)  # rounding can lift a near-certain log-probability above 0


def opening_bans(output: Sequence[int], openings: Sequence[Sequence[int]]) -> frozenset[int]:
    """Tokens that would make `output` exactly one of `openings` (id sequences), checked
    at the start of a text: the phrase's last token is banned, its beginning stays free
    ("I'm" may open a text, "I'm sorry" may not)."""
    n = len(output)
    return frozenset(seq[-1] for seq in openings
                     if len(seq) == n + 1 and tuple(seq[:-1]) == tuple(output))


def phrase_bans(output: Sequence[int], phrases: Sequence[Sequence[int]]) -> frozenset[int]:
    """Tokens that would make `output` end with one of `phrases` (id sequences), anywhere in
    the text: the phrase's last token is banned after the rest of it."""
    return frozenset(seq[-1] for seq in phrases
                     if len(seq) <= len(output) + 1
                     and tuple(output[len(output) - len(seq) + 1:]) == tuple(seq[:-1]))


def repeated_ngram_bans(output: Sequence[int], n: int, times: int = 1) -> frozenset[int]:
    """Tokens that would complete an n-gram already in `output` `times` times (none when
    n < 2).

    Greedy decoding of small models loops ("The essay is written in a way ... The essay is
    written in a way ..."); banning a repeat of any n-gram of the generation's own output (not
    of the prompt, so the user's phrases stay reachable) stops a verbatim loop after n-1 tokens.
    With `times` 2 a shorter n-gram may come back once: the third "We can make sure" of a
    paraphrase loop is cut, a phrase used twice is not.
    """
    if n < 2 or len(output) < n:
        return NOTHING
    tail = list(output[len(output) - n + 1:])
    seen = Counter(int(output[i + n - 1]) for i in range(len(output) - n + 1)
                   if list(output[i:i + n - 1]) == tail)
    return frozenset(token for token, count in seen.items() if count >= times)


def loops(output: Sequence[int], n: int, times: int = 3) -> bool:
    """Whether the last n-gram of `output` is at least its `times`-th occurrence there (False
    when n < 2): the text has started going round. A paraphrase loop ("We can make sure they
    are safe. We can make sure they are alive. …") repeats short n-grams, so a 4-gram seen a
    third time marks it where an 8-gram rule sees nothing."""
    if n < 2 or len(output) < n:
        return False
    last = list(output[len(output) - n:])
    return sum(list(output[i:i + n]) == last for i in range(len(output) - n + 1)) >= times


# --------------------------------------------------------------------------- the factories


def hold_end(eos: frozenset[int], minimum: int, release_after: int,
             release: float) -> Ban:
    """End-of-text is banned before `minimum` tokens of output, unless the deciding model's row
    puts more than `release` on it from `release_after` tokens on (before that, always)."""

    def ban(output: Sequence[int], row: np.ndarray, ids: np.ndarray | None) -> frozenset[int]:
        position = len(output)
        held = position < minimum and (
            position < release_after or end_probability(row, eos, ids) <= release)
        return eos if held else NOTHING

    return ban


def no_repeat(n: int, times: int = 1) -> Ban:
    """No n-gram of the output completed a `times`+1-th time (`repeated_ngram_bans`)."""
    return lambda output, row, ids: repeated_ngram_bans(output, n, times)


def no_opening(openings: Sequence[Sequence[int]]) -> Ban:
    """The text may not open with one of `openings` (`opening_bans`)."""
    return lambda output, row, ids: opening_bans(output, openings)


def no_phrase(phrases: Sequence[Sequence[int]]) -> Ban:
    """The text may not contain one of `phrases` anywhere (`phrase_bans`)."""
    return lambda output, row, ids: phrase_bans(output, phrases)


@dataclass
class LoopEnd:
    """`Params.loop_end_ngram`: once the output's last n-gram came a third time, the text ends
    at the next token that ends a sentence (nothing is banned, so nothing is respelled)."""

    n: int
    sentence_end: Callable[[int], bool]
    looping: bool = False

    def __call__(self, output: Sequence[int]) -> bool:
        """Whether the text ends after `output`, whose last token was just written."""
        self.looping = self.looping or loops(output, self.n)
        return self.looping and self.sentence_end(output[-1])


# --------------------------------------------------------------------------- one generation's


@dataclass
class Rules:
    """The rules one generation applies, composed once (`make_rules`); asked at every token."""

    bans: tuple[Ban, ...] = ()
    end: LoopEnd | None = None
    eos: frozenset[int] = field(default=NOTHING)

    def banned(self, output: Sequence[int], row: np.ndarray,
               ids: np.ndarray | None = None) -> frozenset[int]:
        """Ids the token after `output` may not be; `row` (and `ids`) is the deciding model's
        view of that token: the Specialist that sees the user's texts, or the Generalist for
        the LLM alone, whose row is the log-probabilities of the companion's top-k `ids`."""
        found = NOTHING
        for ban in self.bans:
            found = found | ban(output, row, ids)
        return found

    def forbid(self, output: Sequence[int], row: np.ndarray) -> np.ndarray:
        """A model's full row for the token after `output`, the banned ids made impossible (the
        row also decides an early end)."""
        return forbid(row, self.banned(output, row))

    def ends(self, output: Sequence[int]) -> bool:
        """Whether the text ends after `output` although no end-of-text was written."""
        return self.end is not None and self.end(output)


def forbid(scores: np.ndarray, banned: frozenset[int],
           ids: np.ndarray | None = None) -> np.ndarray:
    """A copy of `scores` with the `banned` ids made impossible (-inf): a full row over the
    vocabulary, or (with `ids`) the scores of those candidate ids. Unchanged when nothing is
    banned."""
    if not banned:
        return scores
    if ids is not None:
        return np.where(np.isin(ids, list(banned)), -np.inf, scores)
    out = np.array(scores, copy=True)
    out[np.fromiter(banned, dtype=np.int64)] = -np.inf
    return out


def without(candidates: SparseSteer, banned: frozenset[int]) -> SparseSteer | None:
    """The companion's candidates minus the `banned` ids (None when nothing is left)."""
    keep = ~np.isin(candidates.ids, np.fromiter(banned, dtype=np.int64))
    if not keep.any():
        return None
    return SparseSteer(candidates.ids[keep], candidates.values[keep])


def make_rules(params: Params, tokenizer: Tokenizer) -> Rules:
    """The rules `params` turn on, for a Specialist with this tokenizer (it spells the banned
    phrases and tells a sentence end); made once per generation."""
    eos = tokenizer.eos_ids
    phrases = phrase_ids(tokenizer, params.meta_openings, params.banned_phrases)
    bans: list[Ban] = []
    if params.min_new_tokens > 0:
        bans.append(hold_end(eos, params.min_new_tokens, params.release_after,
                             params.end_release))
    if params.no_repeat_ngram:
        bans.append(no_repeat(params.no_repeat_ngram))
    if params.loop_ngram:
        bans.append(no_repeat(params.loop_ngram, times=2))
    if phrases.openings:
        bans.append(no_opening(phrases.openings))
    if phrases.anywhere:
        bans.append(no_phrase(phrases.anywhere))
    end = None
    if params.loop_end_ngram:
        decode = tokenizer.decode
        end = LoopEnd(params.loop_end_ngram,
                      lambda token: bool(SENTENCE_END.search(decode([token]))))
    return Rules(tuple(bans), end, eos)
