"""`Params`: every setting of one generation, with its default, defined once — and each
setting's help, range, scope and surfaces beside it (`specsteer.options`).

The settings travel as this one object from `Client` through the decoding loop; the part the
companion needs crosses the wire as `protocol.SessionSettings`, built here by
`Params.session_settings`, so no layer restates a default. The command lines, the bridge's
options and schema (and the TypeScript types), the OpenAI mapping and the docs' options tables
are generated from these fields (`./dev generate`): adding an option is one field here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace

from specsteer.errors import PrivateDraftsWarning
from specsteer.meta_answers import (
    ASSISTANT_OPENINGS,
    ASSISTANT_PHRASES,
    META_OPENINGS,
    unused_phrases,
)
from specsteer.options import (
    APP,
    BOTH,
    COMPANION,
    DEMO,
    EVAL,
    SDK_ONLY,
    Entry,
    Option,
    check,
    device_view,
    option,
)
from specsteer.protocol import Mode, SessionSettings
from specsteer.steer import SELECTS

_WIRE = SessionSettings()  # the method's defaults, written once (protocol.SessionSettings)

LEAK_GUARDS = ("allow", "redact", "hold")
METHODS = ("slm", "slm_rag", "llm", "speculative", "light_costeer", "costeer", "specsteer")
LOCAL_METHODS = ("slm", "slm_rag")

# "fast" also halves the candidate set: the fused choice ranked within the Generalist's top 32
# at 416 of 417 measured positions, so the text is nearly always the top-64 one, at ~60 % of
# the bytes (bench/candidates.py, docs/BENCHMARKS.md)
PRESETS = {
    "default": {"gamma": 0.5},
    "fast": {"gamma": 0.1, "top_k": 32},
    "strict": {"gamma": 1.0},
}
# `preset` is not a setting but a name for some: offered beside the options, applied first
PRESET = Entry("preset", str, None, Option(
    "a preset's settings, explicit options on top: " + ", ".join(
        f"{name} ({', '.join(f'{key} {value:g}' for key, value in values.items())})"
        for name, values in PRESETS.items()), scope=BOTH, choices=tuple(PRESETS),
    surfaces=APP | {DEMO}))
# names an earlier release used, and what to give instead (`Params.preset` says so)
RENAMED = {
    "draft_k": "k",
    "end_release_after": "end_release_from (a share of min_new_tokens, not a token count)",
    "ban_meta_openings": "meta_openings (() turns the rule off)",
    "ban_assistant_openings": "assistant_openings (() turns the rule off)",
    "ban_assistant_phrases": "assistant_phrases (() turns the rule off)",
}


def _joined(banned: tuple[str, ...], candidates: tuple[str, ...],
            texts: list[str]) -> tuple[str, ...]:
    """`banned` plus the `candidates` that none of `texts` uses."""
    return banned + tuple(p for p in unused_phrases(candidates, texts) if p not in banned)


@dataclass(frozen=True)
class Params:
    """Decoding settings; defaults are the paper's. Each field is one option of the registry
    (`specsteer.options`): its help, range, scope and surfaces are written here and nowhere
    else."""

    method: str = option(
        "specsteer", "the decoding method: SpecSteer, or a baseline (slm / slm_rag: the "
        "Specialist alone without / with the history; llm: the Generalist alone; speculative: "
        "classic speculative decoding; light_costeer, costeer)", scope=BOTH, choices=METHODS)
    gamma: float = option(
        _WIRE.gamma, "verification threshold of the ratio test P_G >= gamma * P_S0: 1 strict, "
        "0.5 the default, 0.1 fast (more drafts accepted)", scope=COMPANION, minimum=0)
    alpha: float = option(
        _WIRE.alpha, "steering strength of the private term (the user's history) in the fusion",
        scope=BOTH, minimum=0, surfaces=APP | {EVAL})
    k: int = option(4, "tokens drafted per round (the paper's K; the first K with adaptive_k)",
                    minimum=1, maximum=64, surfaces=APP | {EVAL})
    top_k: int = option(
        _WIRE.top_k, "candidates the companion sends for a recovered or bonus token (preset "
        "fast: 32, fewer bytes)", scope=COMPANION, minimum=1, maximum=0xFFFF,
        surfaces=APP | {EVAL})
    top_p: float = option(
        _WIRE.top_p, "nucleus cut of the candidates: the fewest best ones holding this share of "
        "the Generalist's probability (fewer bytes; 1: all top_k)", scope=COMPANION, above=0,
        maximum=1, openai=("top_p",))
    temperature: float = option(
        _WIRE.temperature, "0: greedy; above 0: sample at this temperature (seeded by seed)",
        scope=BOTH, minimum=0, openai=("temperature",))
    max_new_tokens: int = option(
        256, "the most tokens written (the user's usual length for the task caps it further: "
        "Client's user_length)", minimum=1, maximum=8192, surfaces=APP | {EVAL, DEMO},
        openai=("max_tokens", "max_completion_tokens"))
    min_new_tokens: int = option(
        0, "end-of-text is held back before this many tokens; Client sets it from the user's "
        "usual length for the task (history.length; on the device, never sent)", minimum=0,
        surfaces=SDK_ONLY)
    end_release: float = option(
        0.5, "before min_new_tokens an end-of-text still stands when the deciding model (the "
        "Specialist, which sees the user's texts; the Generalist for the LLM alone) gives it "
        "more than this probability, so a finished letter ends instead of growing filler (1: "
        "always held back)", above=0, maximum=1, surfaces=APP | {EVAL})
    # Asked for an abstract, the Generalist ended 2 of 20 after the title alone (17 and 20
    # tokens of minimums of 102 and 81) with more than `end_release` on the end
    # (docs/BENCHMARKS.md, "Fourth pass")
    end_release_from: float = option(
        0.5, "...but only from this share of min_new_tokens on: an end before it is held back "
        "whatever the model says (a text that short is a title or a one-liner; 0: anywhere "
        "below the minimum)", minimum=0, maximum=1, surfaces=APP | {EVAL})
    # 8 breaks the verbatim loops of greedy small models (20 newsgroup senders: SpecSteer +0.87
    # ROUGE-1 [+0.20, +1.74], looping texts 7 -> 5; 8 abstracts: SLM+RAG +1.39; 20 tweets: no
    # text changed; docs/BENCHMARKS.md, "Fourth pass")
    no_repeat_ngram: int = option(
        8, "never repeat an n-gram of this length of the output itself (stops the verbatim "
        "loops of greedy small models; the prompt's n-grams stay free)", off_or_at_least=2,
        surfaces=APP | {EVAL})
    loop_ngram: int = option(
        0, "never write an n-gram of this length a third time (paraphrase loops; measured at 4 "
        "it ends them but the models respell words to get past it: docs/BENCHMARKS.md, "
        "\"Sixth pass\")", off_or_at_least=2, surfaces=APP | {EVAL})
    loop_end_ngram: int = option(
        0, "end the text at the next sentence end once an n-gram of this length came a third "
        "time (nothing is banned, so nothing is respelled; stats.loop_ended; measured: -0.68 "
        "ROUGE-1 for SpecSteer at 6 on 20 senders, so off: \"Seventh pass\")",
        off_or_at_least=2, surfaces=APP | {EVAL})
    meta_openings: tuple[str, ...] = option(
        META_OPENINGS, "phrases the text may not open with: meta answers (\"I'm sorry, but I "
        "can't assist\", \"As an AI\"; English: specsteer.meta_answers; an app writing in "
        "another language gives its own); empty: off", surfaces=APP | {EVAL})
    assistant_openings: tuple[str, ...] = option(
        ASSISTANT_OPENINGS, "a chat assistant's openings (\"I'm glad you found\", \"I hope "
        "this post finds you well\", \"Dear [\"), banned too unless the user's own retrieved "
        "texts use them (decided on the device: Params.for_user); empty: off",
        surfaces=APP | {EVAL})
    banned_phrases: tuple[str, ...] = option(
        (), "phrases the text may never contain, anywhere (the app's own; the token that would "
        "complete one is never chosen)")
    assistant_phrases: tuple[str, ...] = option(
        ASSISTANT_PHRASES, "the assistant's voice anywhere in the text (\"As an AI\", \"feel "
        "free to ask\", markdown bold, code fences), banned unless the user's retrieved texts "
        "use it (Params.for_user); empty: off", surfaces=APP | {EVAL})
    seed: int = option(_WIRE.seed, "seed of the sampling (temperature > 0), on both sides",
                       scope=BOTH, minimum=0, maximum=2**64 - 1, openai=("seed",))
    select: str = option(
        _WIRE.select, "the companion's candidates: the top-k of the Generalist (generalist) or "
        "of the difference to P_S0 (difference; worse, docs/method.md: kept to report it)",
        scope=COMPANION, choices=SELECTS, surfaces=SDK_ONLY)
    s0_on_device: bool | None = option(
        True, "where P_S0 is computed: True, the device (its public prefill beside the "
        "session's opening, a pass over each draft; measured faster, docs/BENCHMARKS.md "
        "latency run 7); False, the companion (it must host the device's Specialist; pays when "
        "the Generalist's verify costs less than the device's drafting plus that pass: a w8a8 "
        "Generalist); None, the companion when it hosts one, else the device. select "
        "difference keeps it on the companion, which ranks the candidates by it",
        scope=BOTH, surfaces=SDK_ONLY)
    costeer_iterations: int = option(20, "CoSteer's FTRL iterations per token", minimum=0,
                                     surfaces=SDK_ONLY)
    beta: float = option(1.0, "the steering strength of LightCoSteer and CoSteer",
                         surfaces=SDK_ONLY)
    pipeline: bool = option(
        True, "draft the next round while the companion verifies (greedy only; the text is "
        "unchanged)", surfaces=frozenset({EVAL}))
    adaptive_k: bool = option(
        False, "choose K each round in 1..k_max from the measured acceptance, draft step and "
        "verdict latency (specsteer/draft_length.py; starts at k)")
    k_max: int = option(8, "the largest K adaptive_k may choose", minimum=1, maximum=64,
                        surfaces=SDK_ONLY)
    warm_start: bool = option(
        True, "while the device prefills its private prompt the companion writes from the "
        "public prompt (Generalist tokens), then the generation switches to "
        "Draft-Verify-Recover; when a companion is reachable and the prefill left is estimated "
        "at warm_start_min_s or more (device.warm)", surfaces=frozenset({DEMO}))
    warm_start_min_s: float = option(
        4.0, "the estimated prefill time from which a warm start is used (0: whenever "
        "anything is left to prefill); below it the start is cold and the text is the user's "
        "from its first word (measured on an int8 device prefilling ~175 tokens/s: TTFT 1.05x "
        "the Generalist alone against 1.42x cold, end to end 0.88x against 1.00x, ~10 "
        "Generalist tokens first; docs/BENCHMARKS.md, Latency, run 15)", minimum=0,
        surfaces=SDK_ONLY)
    leak_guard: str = option(
        "redact", "what a draft that copies private history does: redact (the default: the "
        "copied word and the tokens after it are cut from the draft, and the pick at that "
        "place writes another word), hold (nothing of the copy, nor after it, is sent; the "
        "rest is written on the device alone), allow (sent, counted; warns "
        "PrivateDraftsWarning); the counts are in stats.leak_flagged / leak_redacted / "
        "leak_held (docs/companion-security.md; the default measured: docs/BENCHMARKS.md, "
        "\"Leak guard\", run 8)",
        choices=LEAK_GUARDS)
    leak_guard_n: int = option(8, "tokens of a private window the leak guard flags",
                               minimum=2, surfaces=SDK_ONLY)

    def __post_init__(self) -> None:
        check(self)
        if self.leak_guard == "allow" and self.collaborative:
            warnings.warn(
                "leak_guard='allow': drafts that copy the user's private history are sent to "
                "the companion word for word; the default 'redact' keeps them on the device",
                PrivateDraftsWarning, stacklevel=3)
        if self.adaptive_k and not 1 <= self.k <= self.k_max:
            raise ValueError(f"adaptive_k needs 1 <= k <= k_max, not k={self.k!r}, "
                             f"k_max={self.k_max!r}")

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
        return cls().updated(**{**PRESETS[name or "default"], **overrides})

    def updated(self, **options: object) -> Params:
        """These settings with `options` on top (names of `Params` fields); a name an earlier
        release used is refused with the one to give instead (`RENAMED`)."""
        renamed = [f"{old} is now {RENAMED[old]}" for old in options if old in RENAMED]
        if renamed:
            raise ValueError("; ".join(renamed))
        return replace(self, **options)  # type: ignore[arg-type]

    @property
    def release_after(self) -> int:
        """Output position from which `end_release` may let an end-of-text stand."""
        return math.ceil(self.end_release_from * self.min_new_tokens)

    def device_view(self) -> Params:
        """These settings with the options only the companion reads at their defaults: what
        the device's own work depends on (`rounds.first_draft_key`)."""
        return device_view(self)

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
