"""The bridge's JSON-RPC error codes and the one exception type handlers raise.

Codes from -32700 to -32600 are JSON-RPC 2.0's own; -32000 to -32099 are SpecSteer's application
codes. They are stable: a code keeps its meaning in every protocol version (docs/bindings.md).
Every error object carries `data.reason`, a short machine-readable name of the failure.
"""

from __future__ import annotations

from typing import Any

from specsteer.errors import (
    CompanionError,
    CompanionRefused,
    CompanionUnavailable,
    ConfigError,
    HistoryCorrupt,
    HistoryError,
    HistoryLocked,
    InvalidQuery,
    InvalidRecord,
    ModelError,
    PromptTooLong,
    RecordNotFound,
    SpecSteerError,
    UnknownTask,
)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
LINE_TOO_LONG = -32001
BUSY = -32020  # a generate is already running (concurrent generate calls are refused)
UNKNOWN_TASK = -32030  # the request's task is none of initialize's capabilities.tasks
INVALID_QUERY = -32031  # the query lacks the field its task needs
PROMPT_TOO_LONG = -32032  # the request alone does not fit the task's prompt token budget
HISTORY_LOCKED = -32040
HISTORY_ERROR = -32041
RECORD_NOT_FOUND = -32042
INVALID_RECORD = -32043
NO_HISTORY = -32044
HISTORY_CORRUPT = -32045
COMPANION_UNAVAILABLE = -32050
COMPANION_ERROR = -32051
MODEL_ERROR = -32060
GENERATION_FAILED = -32061

CODES: dict[int, str] = {
    PARSE_ERROR: "parse_error",
    INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found",
    INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error",
    LINE_TOO_LONG: "line_too_long",
    BUSY: "busy",
    UNKNOWN_TASK: "unknown_task",
    INVALID_QUERY: "invalid_query",
    PROMPT_TOO_LONG: "prompt_too_long",
    HISTORY_LOCKED: "history_locked",
    HISTORY_ERROR: "history_error",
    RECORD_NOT_FOUND: "record_not_found",
    INVALID_RECORD: "invalid_record",
    NO_HISTORY: "no_history",
    HISTORY_CORRUPT: "history_corrupt",
    COMPANION_UNAVAILABLE: "companion_unavailable",
    COMPANION_ERROR: "companion_error",
    MODEL_ERROR: "model_error",
    GENERATION_FAILED: "generation_failed",
}


class BridgeError(Exception):
    """A failure answered as a JSON-RPC error object."""

    def __init__(self, code: int, message: str, **data: Any) -> None:
        super().__init__(message)
        self.code = code
        self.data = {"reason": CODES[code], **data}

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "data": self.data}


# most specific first: the first matching type gives the code
_SDK_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownTask, UNKNOWN_TASK),
    (InvalidQuery, INVALID_QUERY),
    (PromptTooLong, PROMPT_TOO_LONG),
    (HistoryLocked, HISTORY_LOCKED),
    (RecordNotFound, RECORD_NOT_FOUND),
    (InvalidRecord, INVALID_RECORD),
    (HistoryCorrupt, HISTORY_CORRUPT),
    (HistoryError, HISTORY_ERROR),
    (CompanionUnavailable, COMPANION_UNAVAILABLE),
    (CompanionError, COMPANION_ERROR),
    (CompanionRefused, COMPANION_ERROR),
    (ModelError, MODEL_ERROR),
    (ConfigError, INVALID_PARAMS),
    (SpecSteerError, GENERATION_FAILED),
    (ValueError, INVALID_PARAMS),
)


def from_exception(exc: BaseException) -> BridgeError:
    """The error object for an exception the SDK raised (unexpected ones are internal errors)."""
    if isinstance(exc, BridgeError):
        return exc
    for kind, code in _SDK_CODES:
        if isinstance(exc, kind):  # `refused`: no retry fixes it (token, models, version, TLS)
            return BridgeError(code, str(exc), **({"refused": True}
                                                  if isinstance(exc, CompanionRefused) else {}))
    return BridgeError(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
