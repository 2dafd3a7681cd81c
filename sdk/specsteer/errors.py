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

    hint = ""  # what to do about it, when a subclass knows

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"companion error {code}: {message}" + (f"; {self.hint}" if self.hint
                                                                   else ""))
        self.code = code


class GenerationCancelled(SpecSteerError):
    """The caller's cancel event was set: the generation (or its prefill) stopped early."""


class CompanionUnavailable(SpecSteerError):
    """The companion could not be reached, timed out, or dropped the connection: what may come
    back by itself, so the offline policy (`offline=`) decides what happens."""


class CompanionRefused(SpecSteerError):
    """The companion cannot serve this device for a reason no retry fixes: a wrong or revoked
    token, other models, another protocol version, a certificate that does not verify. Not
    "offline": raised at once whatever the offline policy (`offline="degrade"` would otherwise
    hide a configuration mistake behind local-only text)."""


class CompanionAuthError(CompanionRefused, CompanionError):
    """The companion refused the device token (unknown, wrong or revoked; protocol code 9)."""

    hint = ("check Client(token=...): `specsteer-companion tokens create NAME` prints a device "
            "token once")


class CompanionModelMismatch(CompanionRefused, CompanionError):
    """The companion does not serve the models this device expects (protocol code 10): the
    generic Specialist must be the device's very artifact."""

    hint = ("the companion's --specialist must be this device's compiled folder "
            "(`specsteer models path NAME`)")


class CompanionVersionMismatch(CompanionRefused, CompanionError):
    """The companion speaks another wire-protocol version (protocol code 3)."""

    hint = "install the same specsteer release on the device and the companion (CHANGELOG.md)"


class CompanionTLSError(CompanionRefused):
    """The companion's TLS certificate did not verify (unknown issuer, wrong host name,
    expired): check `ssl_context` or the URL's host name."""


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


class ConfigError(SpecSteerError, ValueError):
    """An argument given to the SDK is wrong (a companion URL that is not ws:// or wss://, a
    token that is not a string...): waiting cannot fix it, so it is raised when the object is
    built; the message names the argument and its value."""


class CompanionConfigError(ConfigError):
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
