"""Frames made readable for people: what a "what left this device" panel shows.

`describe_frame` decodes one frame seen by a `FrameTap` into a JSON-friendly dict: direction,
message type, size in bytes, every field, for each token id field the ids with their text
(through the caller's `token_text`, so this module needs no tokenizer), and for each field of
the text's own ids (the request, the drafted and committed tokens) that text decoded whole
(through the caller's `text_of`): what a person reads to check what left. The device token of a
`Hello` is never repeated: only its length is shown. A frame that does not decode is described as
such instead of raising, since an audit view must never break the app it audits.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from specsteer.errors import ProtocolError
from specsteer.protocol.codec import decode
from specsteer.protocol.messages import Hello, Limits

# Fields that hold token ids of the text (shown with their text); values stay numbers.
TOKEN_FIELDS = ("prompt_ids", "committed_ids", "draft_ids", "ids")
# ...of which these are a run of text (a verdict's `ids` are candidates for one position)
TEXT_FIELDS = ("prompt_ids", "committed_ids", "draft_ids")
# Enough for anything a well-behaved peer sends; an audit must decode what the link accepted.
_AUDIT_LIMITS = Limits(max_message_bytes=1 << 30, max_draft=1 << 16, max_prompt_tokens=1 << 20,
                       max_top_k=0xFFFF)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def describe_frame(direction: str, frame: bytes,
                   token_text: Callable[[int], str] | None = None,
                   text_of: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
    """{direction, type, bytes, fields, tokens, texts} of one frame ("up": device ->
    companion)."""
    described: dict[str, Any] = {"direction": direction, "bytes": len(frame)}
    try:
        message = decode(frame, _AUDIT_LIMITS)
    except ProtocolError as exc:
        return {**described, "type": "undecodable", "fields": {"error": str(exc)}, "tokens": {},
                "texts": {}}
    fields = _plain(message)
    if isinstance(message, Hello):
        fields["auth_token"] = f"({len(message.auth_token)} characters, not shown)"
    tokens: dict[str, list[dict[str, Any]]] = {}
    for name in TOKEN_FIELDS:
        ids = getattr(message, name, None)
        if ids:
            tokens[name] = [{"id": int(i), "text": token_text(int(i)) if token_text else None}
                            for i in ids]
    texts = {name: text_of([int(i) for i in getattr(message, name)]) for name in TEXT_FIELDS
             if text_of is not None and getattr(message, name, None)}
    return {**described, "type": type(message).__name__, "fields": fields, "tokens": tokens,
            "texts": texts}
