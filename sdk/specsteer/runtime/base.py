"""The language-model seam: what the decoding loop needs from any runtime.

A *model* is loaded once; each *session* owns its own KV cache, so a companion can hold one
session per connected device on one loaded model. Rewinding is an index move: a session must
give exactly the logits it would give had the rewound tokens never been appended.
Runtimes (ONNX Runtime GenAI today, MLC-LLM later) implement these two protocols; nothing
else in specsteer may import a runtime library directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from specsteer.tokenizer import Tokenizer


@runtime_checkable
class Session(Protocol):
    """One sequence with its own KV cache."""

    @property
    def length(self) -> int:
        """Number of tokens held in the cache."""
        ...

    def append(self, ids: Sequence[int]) -> np.ndarray:
        """Append ids; return float32 logits of shape [len(ids), vocab], one row per position."""
        ...

    def rewind(self, length: int) -> None:
        """Drop every token after the first `length` ones."""
        ...

    def close(self) -> None:
        """Free the cache."""
        ...


class Flag(Protocol):
    """What stops a pass mid-way: a `threading.Event`, or anything else that can say it is
    set (the companion's reply having landed, for a bet's pass: `device.drafting`)."""

    def is_set(self) -> bool: ...


@runtime_checkable
class CancellableSession(Session, Protocol):
    """A session whose pass a cancel stops mid-way (raw ONNX Runtime's terminate flag), whose
    pass releases Python's GIL, and that computes the logits of the rows asked for only.

    A prefill on such a session runs fixed-size passes, the same whatever the CPU's speed, and
    still stops within milliseconds; a session without it is cancelled between passes only.
    Its prefill can run on a thread beside the network's without holding it up, and asks for
    its last row alone (the output layer is the largest matrix of a small model).
    """

    def append_cancellable(
        self, ids: Sequence[int], cancel: Sequence[Flag | None], rows: int | None = None,
    ) -> np.ndarray:
        """`append` (logits of the last `rows` positions only, None: all), or
        `GenerationCancelled` once any flag is set, the session unchanged."""
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A loaded model: its identity, tokenizer and a factory of sessions."""

    name: str
    sha256: str
    vocab_size: int
    context_length: int
    tokenizer: Tokenizer

    def new_session(self) -> Session:
        """Open an empty session."""
        ...
