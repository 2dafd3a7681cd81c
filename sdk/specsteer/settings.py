"""`Params`: every setting of one generation, with its default, defined once.

The settings travel as this one object from `Client` through the decoding loop; the part the
companion needs crosses the wire as `protocol.SessionSettings`, built here by
`Params.session_settings`, so no layer restates a default.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from specsteer.meta_answers import (
    ASSISTANT_OPENINGS,
    ASSISTANT_PHRASES,
    META_OPENINGS,
    unused_phrases,
)
from specsteer.protocol import Mode, SessionSettings
from specsteer.steer import SELECTS

_WIRE = SessionSettings()  # the method's defaults, written once (protocol.SessionSettings)

LEAK_GUARDS = ("allow", "redact", "hold")
# the `Params` fields that hold phrase lists (tuples of non-empty strings)
PHRASE_FIELDS = ("meta_openings", "assistant_openings", "banned_phrases", "assistant_phrases")
# the `Params` fields that hold an n-gram size of a loop rule (0: off, else at least 2)
NGRAM_FIELDS = ("no_repeat_ngram", "loop_ngram", "loop_end_ngram")
METHODS = ("slm", "slm_rag", "llm", "speculative", "light_costeer", "costeer", "specsteer")
LOCAL_METHODS = ("slm", "slm_rag")
# Share of the user's minimum length before which an end-of-text is never released: asked for
# an abstract, the Generalist ended 2 of 20 after the title alone (17 and 20 tokens of minimums
# of 102 and 81) with more than `end_release` on the end (docs/BENCHMARKS.md, "Fourth pass")
END_RELEASE_FROM = 0.5


def release_point(min_new_tokens: int, share: float = END_RELEASE_FROM) -> int:
    """Output position from which an end-of-text may be released under this minimum."""
    return math.ceil(share * min_new_tokens)

# "fast" also halves the candidate set: the fused choice ranked within the Generalist's top 32
# at 416 of 417 measured positions, so the text is nearly always the top-64 one, at ~60 % of
# the bytes (bench/candidates.py, docs/BENCHMARKS.md)
PRESETS = {
    "default": {"gamma": 0.5},
    "fast": {"gamma": 0.1, "top_k": 32},
    "strict": {"gamma": 1.0},
}


def _joined(banned: tuple[str, ...], candidates: tuple[str, ...],
            texts: list[str]) -> tuple[str, ...]:
    """`banned` plus the `candidates` that none of `texts` uses."""
    return banned + tuple(p for p in unused_phrases(candidates, texts) if p not in banned)


@dataclass(frozen=True)
class Params:
    """Decoding settings; defaults are the paper's."""

    method: str = "specsteer"
    gamma: float = _WIRE.gamma
    alpha: float = _WIRE.alpha
    k: int = 4
    top_k: int = _WIRE.top_k
    top_p: float = _WIRE.top_p  # < 1: nucleus cut of the candidates (fewer bytes; 1 = top-k)
    temperature: float = _WIRE.temperature
    max_new_tokens: int = 256
    # end-of-text is held back before this many tokens (the user's typical length, on the
    # device only: `Client` sets it from the history's length policy; never sent up)
    min_new_tokens: int = 0
    # ...unless the deciding model (the Specialist, which sees the user's texts; the Generalist
    # for the LLM alone) puts more than this probability on ending: a finished letter or a
    # refusal ends instead of growing filler to the minimum (1: always held back)
    end_release: float = 0.5
    # ...and only from this many tokens on (None: `END_RELEASE_FROM` of min_new_tokens): an
    # end before it is held back whatever the model says, since a text that short is a title
    # or a one-line answer, not the text asked for
    end_release_after: int | None = None
    # never repeat an n-gram of the output itself (0: off); device-only like min_new_tokens.
    # 8 breaks the verbatim loops of greedy small models (20 newsgroup senders: SpecSteer +0.87
    # ROUGE-1 [+0.20, +1.74], looping texts 7 -> 5; 8 abstracts: SLM+RAG +1.39; 20 tweets: no
    # text changed; docs/BENCHMARKS.md, "Fourth pass")
    no_repeat_ngram: int = 8
    # ...and no n-gram of this length a third time (0: off): paraphrase loops ("We can make
    # sure they are safe. We can make sure they are alive. …") repeat short n-grams, not 8-grams
    loop_ngram: int = 0
    # ...or end the text at the first sentence end after an n-gram of this length came a third
    # time (0: off): nothing is banned, so nothing is respelled; the loop stops where a
    # sentence does (device-only; `steer.loops`)
    loop_end_ngram: int = 0
    # phrases the output may not open with: meta answers ("I'm sorry, but I can't assist …";
    # `meta_answers`); device-only; () turns the rule off
    meta_openings: tuple[str, ...] = META_OPENINGS
    # ...and the assistant's openings ("I'm glad you found …", "I hope this post finds you
    # well"), but only those the user's own retrieved texts never use: `for_user` adds them to
    # meta_openings (`Client` does, on the device, for every method); () turns it off
    assistant_openings: tuple[str, ...] = ASSISTANT_OPENINGS
    # phrases the output may not contain anywhere (the app's own; device-only)...
    banned_phrases: tuple[str, ...] = ()
    # ...and the assistant's voice after the opening ("As an AI language model", "feel free to
    # ask", markdown bold, code fences), again only those the user's texts never use:
    # `for_user` adds them to banned_phrases; () turns it off
    assistant_phrases: tuple[str, ...] = ASSISTANT_PHRASES
    seed: int = _WIRE.seed
    select: str = _WIRE.select  # or "difference" (docs/method.md: worse; kept to report it)
    # where P_S0 is computed: None = the companion when it hosts the generic Specialist, else the
    # device; True pays when the Specialist is much cheaper than the Generalist (int4)
    s0_on_device: bool | None = None
    costeer_iterations: int = 20
    beta: float = 1.0
    pipeline: bool = True  # draft the next round while the companion verifies (greedy only)
    adaptive_k: bool = False  # choose K each round in [1, k_max] from measured costs (starts at k)
    k_max: int = 8
    # warm start: while the device prefills its private prompt, the companion writes from the
    # public prompt (Generalist tokens), then the generation switches to Draft-Verify-Recover;
    # used when a companion is reachable and the prefill left is estimated to take at least
    # `warm_start_min_s` (`device.warm.estimated_prefill_s`; 0 = whenever anything is left)
    warm_start: bool = True
    warm_start_min_s: float = 0.5
    # what a draft that copies private history does (device/leak_guard.py): "allow" (send it,
    # count it), "redact" (cut it, ban the span's next token), "hold" (finish on the device)
    leak_guard: str = "allow"
    leak_guard_n: int = 8  # tokens in a private window that the guard flags

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.k < 0 or self.top_k < 1 or self.max_new_tokens < 0 or self.gamma < 0:
            raise ValueError("k >= 0, top_k >= 1, max_new_tokens >= 0 and gamma >= 0 are required")
        if self.select not in SELECTS:
            raise ValueError("select must be 'generalist' or 'difference'")
        if self.warm_start_min_s < 0:
            raise ValueError("warm_start_min_s must be >= 0")
        if self.leak_guard not in LEAK_GUARDS:
            raise ValueError(f"leak_guard must be one of {', '.join(LEAK_GUARDS)}, "
                             f"not {self.leak_guard!r}")
        if self.leak_guard_n < 2:
            raise ValueError("leak_guard_n must be at least 2")
        if not 0.0 < self.end_release <= 1.0:
            raise ValueError("end_release must be in (0, 1]")
        if self.end_release_after is not None and self.end_release_after < 0:
            raise ValueError("end_release_after must be None or >= 0")
        for name in PHRASE_FIELDS:
            phrases = getattr(self, name)
            if not isinstance(phrases, tuple) or not all(isinstance(p, str) and p for p in phrases):
                raise ValueError(f"{name} must be a tuple of non-empty strings")
        for name in NGRAM_FIELDS:
            size = getattr(self, name)
            if size < 0 or size == 1:
                raise ValueError(f"{name} must be 0 (off) or at least 2")
        if self.adaptive_k and not 1 <= self.k <= self.k_max:
            raise ValueError("adaptive_k needs 1 <= k <= k_max")

    def for_user(self, texts: Iterable[str]) -> Params:
        """These settings for a user whose own texts (the retrieved examples) are `texts`: the
        assistant openings and phrases they never write join the banned ones."""
        if not self.assistant_openings and not self.assistant_phrases:
            return self
        texts = list(texts)
        return replace(
            self, meta_openings=_joined(self.meta_openings, self.assistant_openings, texts),
            banned_phrases=_joined(self.banned_phrases, self.assistant_phrases, texts),
            assistant_openings=(), assistant_phrases=())

    @classmethod
    def preset(cls, name: str | None = None, **overrides: object) -> Params:
        """A preset's settings ("default", "fast", "strict"), with explicit overrides on top."""
        if name is not None and name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name or "default"], **overrides})  # type: ignore[arg-type]

    @property
    def release_after(self) -> int:
        """Output position from which `end_release` may let an end-of-text stand."""
        if self.end_release_after is not None:
            return self.end_release_after
        return release_point(self.min_new_tokens)

    @property
    def collaborative(self) -> bool:
        """Whether the method needs the companion at all."""
        return self.method not in LOCAL_METHODS

    def session_settings(self, mode: Mode, s0_on_device: bool) -> SessionSettings:
        """What the companion needs of these settings for a session in `mode`."""
        return SessionSettings(
            mode=mode,
            gamma=self.gamma,
            alpha=0.0 if self.method == "llm" else self.alpha,
            top_k=self.top_k,
            temperature=self.temperature,
            seed=self.seed,
            select=self.select,
            s0_on_device=s0_on_device,
            top_p=self.top_p,
        )
