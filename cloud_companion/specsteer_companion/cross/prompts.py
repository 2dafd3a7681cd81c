"""The public prompt in the Generalist's own format, when the tokenizers differ.

The device sends its public prompt as Specialist ids; the companion decodes them to text and,
for a ChatML conversation, re-renders it in the Generalist's chat format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from specsteer.tokenizer import Message, Tokenizer
from specsteer_companion.cross.alignment import TokenTable

_CHATML_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.DOTALL)
_CHATML_OPEN = "<|im_start|>assistant\n"


def parse_chatml(text: str) -> tuple[list[Message], bool] | None:
    """The turns of a ChatML prompt and whether it ends with an open assistant turn, or None."""
    messages: list[Message] = []
    at = 0
    for m in _CHATML_TURN.finditer(text):
        if m.start() != at:
            return None
        messages.append(Message(m.group(1), m.group(2)))
        at = m.end()
    rest = text[at:]
    if rest not in ("", _CHATML_OPEN) or not messages:
        return None
    return messages, rest == _CHATML_OPEN


def generalist_prompt(s_table: TokenTable, g_tok: Tokenizer,
                      prompt_ids: Sequence[int]) -> list[int]:
    """The Generalist's ids for the public prompt the device sent as Specialist ids.

    The prompt is decoded to text; a ChatML conversation is re-rendered in the Generalist's
    chat format (ChatML again for Qwen, plain text for a base model such as Gemma-3), anything
    else is taken as plain text. The Generalist's tokenizer adds its own start token if it has
    one (Gemma's <bos>).
    """
    text = s_table.bytes_of(prompt_ids).decode("utf-8", errors="replace")
    parsed = parse_chatml(text) if s_table.tokenizer.chat_template == "chatml" else None
    if parsed is not None:
        messages, open_turn = parsed
        text = g_tok.render_chat(messages, add_generation_prompt=open_turn)
    return g_tok.encode(text, add_special=True)


