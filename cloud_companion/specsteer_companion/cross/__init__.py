"""Verification across tokenizers: the companion reads the Specialist's draft as text.

`session` (CrossVerifierSession: span tests and recovery over Specialist ids), `alignment`
(byte tables of two tokenizers), `walk` (a distribution re-expressed in the other vocabulary),
`prompts` (the public prompt in the Generalist's format). See docs/cross-tokenizer.md.
"""

from specsteer_companion.cross.prompts import generalist_prompt, parse_chatml
from specsteer_companion.cross.session import (
    CrossStats,
    CrossVerifierSession,
    ScoredText,
    SpanCheck,
)

__all__ = [
    "CrossStats", "CrossVerifierSession", "ScoredText", "SpanCheck", "generalist_prompt",
    "parse_chatml",
]
