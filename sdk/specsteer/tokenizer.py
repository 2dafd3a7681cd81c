"""Text ↔ token ids for a compiled model, with its chat format and end-of-text ids.

Wraps the `tokenizers` library (no transformers at run time); nothing outside this module
touches the wrapped object: what alignment needs of it (vocabulary, added tokens, decoder
settings, pre-tokenizer split, batch encoding) has its own method here. The vocabulary hash
identifies a tokenizer by content, not by name: two models share the token path of the decoding
loop only if their hashes are equal. `StreamDecoder` turns ids into text as they are generated.
`check_text` says what text can be tokenized at all: a str that UTF-8 can encode (a lone
surrogate such as "\\ud800", which JSON's escapes can carry, cannot).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from specsteer.errors import ModelError, TokenizerMissing

_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>", "</s>")


def check_text(value: object, field: str) -> str:
    """`value` if it is text a tokenizer can encode; else a ValueError naming `field` and the
    first character that is not (callers map it to invalid params, never an internal error)."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = value[exc.start]
        raise ValueError(f"{field} is not valid Unicode text: a lone surrogate U+{ord(char):04X} "
                         f"at character {exc.start}") from None
    return value


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: str  # "system" | "user" | "assistant"
    content: str


class Tokenizer:
    """A model's tokenizer: encode/decode, chat rendering and stop ids.

    chat_template: "chatml" (the registry's models), "none" (base models: plain text) or
    "jinja": the model's own template (`template`, a `ChatTemplate`), as an added model brings.
    """

    def __init__(
        self, hf: _HFTokenizer, *, chat_template: str = "chatml", eos_ids: Sequence[int] = (),
        template: ChatTemplate | None = None,
    ) -> None:
        if (chat_template == "jinja") != (template is not None):
            raise ModelError('chat_template "jinja" comes with its template, and only it does')
        self._hf = hf
        self.chat_template = chat_template
        self._template = template
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
        template = ChatTemplate.from_folder(Path(folder)) if chat_template == "jinja" else None
        return cls(hf, chat_template=chat_template, eos_ids=eos_ids, template=template)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        """Ids of `text`; `add_special` adds the tokenizer's own special tokens (Gemma's <bos>)."""
        return self._hf.encode(check_text(text, "text"), add_special_tokens=add_special).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, no special tokens added; one call into the library for all."""
        return [enc.ids for enc in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def vocab(self, *, with_added: bool = True) -> dict[str, int]:
        """Token string -> id; `with_added=False` leaves out the added (chat, control) tokens."""
        return self._hf.get_vocab(with_added_tokens=with_added)

    def added_tokens(self) -> dict[int, tuple[str, bool]]:
        """The added tokens by id, as (content, special): they match raw text, not the model's
        token alphabet; special ones are control tokens that `decode` skips."""
        return {
            tid: (added.content, bool(added.special))
            for tid, added in self._hf.get_added_tokens_decoder().items()
        }

    def decoder_config(self) -> dict[str, Any] | None:
        """The `decoder` section of tokenizer.json (how token strings become text), or None."""
        decoder = self._hf.decoder
        return None if decoder is None else json.loads(decoder.__getstate__())

    def pre_tokenize(self, text: str) -> list[tuple[str, tuple[int, int]]] | None:
        """The pre-tokenizer's split of raw `text`: (piece, (start, end)) with character
        offsets; None when the tokenizer has no pre-tokenizer."""
        pre = self._hf.pre_tokenizer
        return None if pre is None else pre.pre_tokenize_str(text)

    def stream_decoder(self, *, skip_special: bool = True) -> StreamDecoder:
        """A `StreamDecoder` over this tokenizer: text as ids arrive, equal to `decode`."""
        return StreamDecoder(self, skip_special=skip_special)

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        """Ids of the control tokens `decode` leaves out when it skips special tokens."""
        return frozenset(tid for tid, (_, special) in self.added_tokens().items() if special)

    @cached_property
    def _byte_fallback_ids(self) -> frozenset[int]:
        """Ids of <0xNN> tokens when the decoder turns them into bytes (SentencePiece)."""
        if '"ByteFallback"' not in json.dumps(self.decoder_config()):
            return frozenset()
        return frozenset(
            tid for token, tid in self.vocab(with_added=False).items() if _is_byte_token(token)
        )

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
        if self._template is not None:
            return self._template.render(messages, add_generation_prompt=add_generation_prompt)
        parts = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def chat_ids(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a conversation, ready to append to a session."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt))


class ChatTemplate:
    """A model's own Jinja chat template (chat_template.jinja of its folder), rendered as
    transformers renders it: a sandbox, trimmed blocks, `raise_exception`, `strftime_now`,
    `tojson`, and the bos/eos token strings of its tokenizer_config.json."""

    def __init__(self, text: str, *, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _refuse
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(text)
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate:
        path = folder / "chat_template.jinja"
        if not path.is_file():
            raise TokenizerMissing(f"{path} is missing: the folder's manifest names a chat "
                                   "template it does not hold; recompile it")
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        return cls(path.read_text(), bos_token=_token_text(config.get("bos_token")),
                   eos_token=_token_text(config.get("eos_token")))

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
            eos_token=self.eos_token, tools=None, documents=None)


def _refuse(message: str) -> None:
    raise ModelError(f"the model's chat template refused the conversation: {message}")


def _token_text(token: object) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(token, dict):
        return str(token.get("content", ""))
    return token if isinstance(token, str) else ""


def _is_byte_token(token: str) -> bool:
    """The tokenizers library's own test for a byte-fallback token: <0xNN>, NN in hex."""
    if len(token) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return False
    try:
        int(token[3:5], 16)
    except ValueError:
        return False
    return True


class StreamDecoder:
    """Text of a growing id sequence, one piece per id: the incremental form of `decode`.

    The pieces `push` returns, followed by `flush()`, concatenate to exactly
    `tokenizer.decode(all_ids, skip_special=...)`. Each push decodes a bounded window, not the
    whole text: the ids of the last emitted piece (context for decoders that strip a leading
    space or join tokens) and the ids held since. Text is held back (`pending`) while it is not
    final: while the window ends inside a UTF-8 character (the decode ends in U+FFFD), and, for
    byte-fallback tokenizers, while it ends in <0xNN> tokens (the ByteFallback decoder makes a
    whole run of them U+FFFDs if any byte is invalid, so a later byte can change earlier text).
    Ids that decode to nothing (skipped special tokens, ids beyond the vocabulary) never enter
    the window, so a window's first id carries text, as it does in the full decode.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._silent = tokenizer._special_ids if skip_special else frozenset()
        self._bytes = tokenizer._byte_fallback_ids
        self._window: list[int] = []  # the last emitted piece's ids, then the held ones
        self._emitted = 0  # how many ids of the window belong to the last emitted piece
        self._emitted_text = ""  # the decode of those ids on their own

    @property
    def pending(self) -> bool:
        """Whether ids are held whose text is not final yet (`flush` gives it at the end)."""
        return len(self._window) > self._emitted

    def push(self, token: int) -> str:
        """The new final text after `token`: "" while it is held back or carries no text."""
        token = int(token)
        if token in self._silent or self._tokenizer.id_to_token(token) is None:
            return ""
        self._window.append(token)
        if token in self._bytes:
            return ""
        text = self._decode()
        if text.endswith("\ufffd"):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """The held-back text at the end of the sequence (it may end in U+FFFD: bytes that never
        completed a character); "" when nothing is held."""
        return self._emit(self._decode()) if self.pending else ""

    def _decode(self) -> str:
        return self._tokenizer.decode(self._window, skip_special=self._skip_special)

    def _emit(self, text: str) -> str:
        if not text.startswith(self._emitted_text):
            raise ModelError(
                "this tokenizer's decoder does not decode incrementally: the text of earlier "
                "tokens changed when more followed"
            )
        piece = text[len(self._emitted_text) :]
        del self._window[: self._emitted]
        self._emitted = len(self._window)
        self._emitted_text = self._decode()
        return piece
