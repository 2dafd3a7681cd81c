"""Exception types of the SDK and the companion.

Every failure a user can act on has its own type and a message that says what to do next.
"""

from __future__ import annotations


class SpecSteerError(Exception):
    """Base class of every error raised on purpose by specsteer."""


class ModelError(SpecSteerError):
    """A model could not be fetched, verified, compiled or loaded."""


class UnknownModelError(ModelError):
    """The name is not in the model registry."""


class ModelHashMismatch(ModelError):
    """An assembled or cached GGUF does not have the SHA-256 the registry records."""


class ModelNotFetched(ModelError):
    """The GGUF is not in the cache yet: run `specsteer models fetch NAME`."""


class ModelNotCompiled(ModelError):
    """No compiled ONNX Runtime folder exists: run `specsteer models compile NAME`."""


class CorruptModelError(ModelError):
    """A model file or folder is truncated, damaged or incomplete."""


class TokenizerMissing(ModelError):
    """A compiled model folder has no usable tokenizer.json."""


class SessionError(SpecSteerError):
    """A runtime session was used wrongly (rewind past its start, ids outside the vocabulary...)."""


class HistoryError(SpecSteerError):
    """The personal history store could not complete an operation."""


class ProtocolError(SpecSteerError):
    """A wire message is malformed, oversized, out of order or of an unknown type."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class CompanionError(SpecSteerError):
    """The companion refused a request or reported an error (carries its error code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"companion error {code}: {message}")
        self.code = code


class GenerationCancelled(SpecSteerError):
    """The caller's cancel event was set: the generation (or its prefill) stopped early."""


class CompanionUnavailable(SpecSteerError):
    """The companion could not be reached, timed out, or dropped the connection."""


class CompanionTimedOut(CompanionUnavailable):
    """The companion is connected but did not answer in time (stalled or overloaded): unlike a
    dropped link, a fresh connection is not tried at once (see `device.loop`)."""


class HistoryLocked(HistoryError):
    """Another connection kept the history file locked for longer than the busy timeout."""

    def __init__(self, path: str, waited_s: float, detail: str = "") -> None:
        message = (
            f"history store {path} is locked by another connection (waited {waited_s:.2f}s); "
            "close other apps using it or retry later"
        )
        super().__init__(f"{message}: {detail}" if detail else message)
        self.path = path
        self.waited_s = waited_s


class HistoryReadOnly(HistoryError):
    """A write to a history opened read-only (the file or its folder is not writable)."""


class HistoryCorrupt(HistoryError):
    """The history file is not a SQLite database, is damaged, or has a newer schema."""


class RecordNotFound(HistoryError):
    """No record with this id is in the history store."""

    def __init__(self, record_id: str) -> None:
        super().__init__(f"no history record with id {record_id!r}")
        self.record_id = record_id


class InvalidRecord(HistoryError, ValueError):
    """A record's fields are missing or malformed (empty kind, bad date, meta not a dict...)."""


class IngestError(HistoryError):
    """A file given to import could not be read or parsed; the message names file and line."""


class UnknownTask(HistoryError, ValueError):
    """The prompt task name is not one of `specsteer.history.prompts.task_names()`."""


class PromptTooLong(HistoryError):
    """The request alone does not fit the prompt token budget, before any context is added."""


class CompanionConfigError(SpecSteerError, ValueError):
    """A companion setting is invalid: a limit out of range, a bad device name, a TLS option."""


class TLSFileError(CompanionConfigError):
    """A certificate or key file is missing, unreadable, not PEM, or the two do not match."""


class TokenStoreError(SpecSteerError):
    """The device token store could not be opened or is not one (damaged, newer schema)."""


class CompanionLimitError(SpecSteerError, RuntimeError):
    """A companion limiter was used wrongly, e.g. released a session it never granted."""


class InvalidQuery(HistoryError, ValueError):
    """A prompt query item lacks the field its task needs (e.g. "title" for "abstract")."""


class PrivateDraftsWarning(UserWarning):
    """Settings under which drafts that copy the user's private history leave the device
    (`Params(leak_guard="allow")`): an explicit opt-in, said out loud once per process."""
