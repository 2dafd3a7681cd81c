"""Text ↔ token ids for a compiled model, with its chat format and end-of-text ids.

Wraps the `tokenizers` library (no transformers at run time). The vocabulary hash identifies a
tokenizer by content, not by name: two models share the token path of the decoding loop only if
their hashes are equal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from specsteer.errors import TokenizerMissing

_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>", "</s>")


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: str  # "system" | "user" | "assistant"
    content: str


class Tokenizer:
    """A model's tokenizer: encode/decode, chat rendering and stop ids."""

    def __init__(
        self, hf: _HFTokenizer, *, chat_template: str = "chatml", eos_ids: Sequence[int] = ()
    ) -> None:
        self._hf = hf
        self.chat_template = chat_template
        vocab = hf.get_vocab(with_added_tokens=True)
        ends = {vocab[m] for m in _END_MARKERS if m in vocab}
        self.eos_ids: frozenset[int] = frozenset(ends | set(eos_ids))
        self.vocab_hash = hashlib.sha256(
            json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()
        ).hexdigest()

    @classmethod
    def from_folder(
        cls, folder: str | Path, *, chat_template: str = "chatml", eos_ids: Sequence[int] = ()
    ) -> Tokenizer:
        """Load `tokenizer.json` from a compiled model folder."""
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerMissing(
                f"{path} is missing: the model folder is incomplete; recompile it with "
                "`specsteer models compile NAME --force`"
            )
        try:
            hf = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception on bad JSON
            raise TokenizerMissing(f"{path} is not a valid tokenizer ({exc}); recompile") from exc
        return cls(hf, chat_template=chat_template, eos_ids=eos_ids)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with no special tokens added."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def count(self, text: str) -> int:
        """Number of tokens of `text` (prompt budgeting)."""
        return len(self.encode(text))

    def render_chat(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of a conversation in this model's chat format."""
        if self.chat_template == "none":  # base models: plain text, blank line between turns
            text = "\n\n".join(m.content for m in messages if m.content)
            return text + ("\n\n" if add_generation_prompt else "")
        parts = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def chat_ids(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a conversation, ready to append to a session."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt))
