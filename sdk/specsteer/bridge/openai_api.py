"""The OpenAI chat-completions contract of `specsteer bridge --http`: request bodies checked and
mapped onto `generate` params, the bridge's errors as OpenAI error bodies and statuses, usage.

What a body may hold: `model` (the served model's id; another is 404 `model_not_found`),
`messages` (one user message: its text is the request), `max_tokens` / `max_completion_tokens`,
`temperature`, `top_p`, `seed`, `stop`, `stream`, `stream_options.include_usage`, `n` = 1, `user`,
and the extension `specsteer` (any generate param: task, preset, offline...). OpenAI parameters
the endpoint does not implement (`tools`, `response_format`, `logprobs`, penalties...) are
accepted only at the value that asks for nothing, and refused with a 400 naming them otherwise;
a member OpenAI does not define is refused too. No transport here (`http.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specsteer.bridge.errors import BridgeError
from specsteer.bridge.schemas import check_params, check_text_members
from specsteer.options import openai_fields
from specsteer.settings import Params

# OpenAI fields that map onto generate params: each option's `openai` names in the registry
# (settings.py), and `stop` (a stream parameter, not a setting)
MAPPED = {**openai_fields(Params), "stop": "stop"}
# read by the endpoint itself, or harmless to accept (`user`: an end-user id for the provider)
HANDLED = {"model", "messages", "stream", "stream_options", "n", "user", "specsteer"}
# OpenAI parameters not implemented: accepted at the value that asks for nothing (or null)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,),
    "top_logprobs": (0,), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none", "auto"),
    "parallel_tool_calls": (True, False), "functions": ([],), "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},), "modalities": (["text"],), "store": (False,),
    "metadata": ({},), "service_tier": ("auto", "default"), "audio": (), "prediction": (),
    "reasoning_effort": (), "web_search_options": (), "verbosity": (),
    "prompt_cache_key": (), "safety_identifier": (),
}
WHY_NOT = ("SpecSteer writes plain text in the user's voice from their on-device history; "
           "leave these out")


@dataclass(frozen=True)
class Completion:
    """A checked chat-completions request: generate params and how to answer."""

    params: dict[str, Any]
    stream: bool
    include_usage: bool


class OpenAIError(Exception):
    """An error answered with OpenAI's body `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, code: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", retry: bool | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind
        self.retry = retry  # sent as `x-should-retry`, which the openai clients honour

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


def model_not_found(name: object) -> OpenAIError:
    return OpenAIError(404, f"The model {name!r} does not exist: this endpoint serves the model "
                       "GET /v1/models lists", "model_not_found", param="model")


def completion_request(body: Any, model_id: str) -> Completion:
    """A chat-completions body as generate params, or the OpenAIError it deserves."""
    try:  # every string of it, params or not (model, roles): JSON escapes carry lone surrogates
        check_text_members(body, "the body")
    except BridgeError as exc:
        raise OpenAIError(400, str(exc), "invalid_params") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the body must be a JSON object", "invalid_body")
    given = {name: value for name, value in body.items() if value is not None}
    _refuse_unsupported(given)
    if "model" not in given:
        raise OpenAIError(400, "you must provide a model parameter (GET /v1/models lists it)",
                          "missing_required_parameter", param="model")
    if given["model"] != model_id:
        raise model_not_found(given["model"])
    if given.get("n", 1) != 1:
        raise OpenAIError(400, f"n={given['n']!r}: only n = 1 is supported",
                          "unsupported_value", param="n")
    stream = given.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, f"stream must be a boolean, not {stream!r}", "invalid_type",
                          param="stream")
    params: dict[str, Any] = {"query": _request_text(given.get("messages"))}
    for field, name in MAPPED.items():  # the registry names max_tokens first, so the newer
        if field != "stop" and field in given:  # max_completion_tokens wins when both are given
            params[name] = given[field]
    if "stop" in given:
        params["stop"] = [given["stop"]] if isinstance(given["stop"], str) else given["stop"]
    extension = given.get("specsteer", {})
    if not isinstance(extension, dict):
        raise OpenAIError(400, "specsteer must be an object of generate params (task, preset, "
                          f"...), not {extension!r}", "invalid_type", param="specsteer")
    params.update(extension)
    try:
        checked = check_params("generate", params)
    except BridgeError as exc:
        raise _schema_error(exc, given) from None
    return Completion(checked, stream, _include_usage(given, stream))


def _refuse_unsupported(given: dict[str, Any]) -> None:
    unknown = [n for n in given if n not in MAPPED and n not in HANDLED and n not in NEUTRAL]
    if unknown:
        raise OpenAIError(400, f"Unrecognized request argument(s) supplied: {', '.join(unknown)}",
                          "unknown_parameter", param=unknown[0])
    refused = [n for n in given if n in NEUTRAL and given[n] not in NEUTRAL[n]]
    if refused:
        listed = ", ".join(f"{n}={given[n]!r}" for n in refused)
        raise OpenAIError(400, f"unsupported parameter(s): {listed}. {WHY_NOT}",
                          "unsupported_parameter", param=refused[0])


def _request_text(messages: Any) -> str:
    """The text of the one user message: the request. System prompts and earlier turns are
    refused by name rather than dropped: the prompt comes from the task and the history."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "messages must be a non-empty list with one user message: its "
                          "text is the request", "invalid_value", param="messages")
    for at, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role != "user" or at != len(messages) - 1:
            raise OpenAIError(
                400, f"messages[{at}] (role {role!r}) is not read: the request is one user "
                "message, and the prompt around it comes from the task template and the user's "
                "on-device history; send only that message", "unsupported_value",
                param=f"messages[{at}]")
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"messages[{len(messages) - 1}].content must be text or a list "
                          f"of text parts, not {content!r}", "invalid_type",
                          param=f"messages[{len(messages) - 1}].content")
    for at, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"messages[{len(messages) - 1}].content[{at}] (type {kind!r})"
                              ": only text parts are read", "unsupported_value",
                              param=f"messages[{len(messages) - 1}].content[{at}]")
    return "".join(part["text"] for part in content)


def _include_usage(given: dict[str, Any], stream: bool) -> bool:
    options = given.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise OpenAIError(400, "stream_options is only allowed when stream is true",
                          "invalid_value", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"} \
            or not isinstance(options.get("include_usage", False), bool):
        raise OpenAIError(400, "stream_options takes include_usage (a boolean), not "
                          f"{options!r}", "invalid_value", param="stream_options")
    return bool(options.get("include_usage", False))


def _schema_error(error: BridgeError, given: dict[str, Any]) -> OpenAIError:
    """The generate schema's first complaint, with the body's own field names."""
    problems = error.data.get("errors") or [{"path": [], "message": str(error)}]
    path, message = problems[0]["path"], problems[0]["message"]
    head = path[0] if path else None
    if head == "query":
        name = "messages"
    elif head == "max_new_tokens":
        name = "max_completion_tokens" if "max_completion_tokens" in given else "max_tokens"
    elif head in MAPPED and head in given:
        name = head
    else:
        name = f"specsteer.{head}" if head is not None else "specsteer"
    where = name + "".join(f"[{p!r}]" for p in path[1:])
    return OpenAIError(400, f"{where}: {message}", "invalid_value", param=name)


# the bridge's error reasons as HTTP answers: (status, OpenAI type, code, param, retry)
_ANSWERS: dict[str, tuple[int, str, str | None, str | None, bool | None]] = {
    "invalid_params": (400, "invalid_request_error", "invalid_value", None, None),
    "unknown_task": (400, "invalid_request_error", None, "specsteer.task", None),
    "invalid_query": (400, "invalid_request_error", None, "messages", None),
    "prompt_too_long": (400, "invalid_request_error", "context_length_exceeded", "messages",
                        None),
    "busy": (429, "rate_limit_error", None, None, None),
    "companion_unavailable": (503, "server_error", None, None, None),
    "companion_error": (502, "server_error", None, None, None),
    "history_locked": (503, "server_error", None, None, None),
}


def bridge_error(error: BridgeError) -> OpenAIError:
    """A bridge error as the OpenAI error answered for it: a 4xx for what the request got
    wrong, 429 busy, 502/503 for the companion, 500 only for failures of the bridge itself."""
    reason = error.data["reason"]
    status, kind, code, param, retry = _ANSWERS.get(reason, (500, "server_error", None, None,
                                                             None))
    if error.data.get("refused"):  # the companion refuses the bridge: no retry fixes it
        retry = False
    return OpenAIError(status, str(error), code or reason, param=param, kind=kind, retry=retry)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
