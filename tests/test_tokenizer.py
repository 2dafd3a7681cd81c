"""Tokenizer: the incremental detokenizer (StreamDecoder) against full decodes, its cost, and
Client.stream's pieces against the decode-everything-per-token assembly it replaced.

Two kinds of tokenizer: the tiny test models' byte-level BPE (GPT-2 style: every byte is a
token, so model output may split or corrupt UTF-8 anywhere) and SentencePiece-style ones built
here with the `tokenizers` library, as Llama/Gemma write them: '▁' for spaces, <0xNN>
byte-fallback tokens, and a decoder that strips the text's leading space (Strip or Metaspace).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.models.tiny import tiny_model_dir
from specsteer.tokenizer import Tokenizer

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TRICKY = [
    "Hello  world\n\nZürich 東京 😀 x=1234; naïve café — “quotes” ½ Ångström",
    "東京都は日本の首都です。😀👩‍👩‍👧 🇫🇷",
    "   leading    and trailing   \r\n windows line\r\nend\n",
    " a leading space, then\n\n\tnewlines and tabs",
    "😀😀😀",
]
_SP_PIECES = ["▁", "a", "b", "e", "l", "o", "h", "w", "r", "d", "x", "▁a", "▁b", "ab", "▁ab",
              "he", "hel", "hell", "hello", "▁hello", "▁w", "▁wo", "▁wor", "▁worl", "▁world",
              "東", "京", "\n", "é"]
_SP_MERGES = [("▁", "a"), ("▁", "b"), ("a", "b"), ("▁", "ab"), ("h", "e"), ("he", "l"),
              ("hel", "l"), ("hell", "o"), ("▁", "hello"), ("▁", "w"), ("▁w", "o"), ("▁wo", "r"),
              ("▁wor", "l"), ("▁worl", "d")]
FIRST_BYTE_ID = 3  # <unk>, <s>, </s>, then <0x00>..<0xFF>
SP_BYTE_IDS = frozenset(range(FIRST_BYTE_ID, FIRST_BYTE_ID + 256))


def _sentencepiece(style: str) -> Tokenizer:
    """A SentencePiece-style BPE with byte fallback; style "strip" is Llama-2's decoder
    (Replace, ByteFallback, Fuse, Strip one leading space), "metaspace" the newer Metaspace one.
    Encoding adds <s> as a special token, as Llama's post-processor does."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": FIRST_BYTE_ID + b for b in range(256)})
    for piece in _SP_PIECES:
        vocab.setdefault(piece, len(vocab))
    tok = HFTokenizer(
        models.BPE(vocab, _SP_MERGES, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    if style == "strip":
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")]
        )
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return Tokenizer(tok)


TOKENIZERS = {
    "byte_level": lambda: Tokenizer.from_folder(tiny_model_dir("llama", seed=0)),
    "strip": lambda: _sentencepiece("strip"),
    "metaspace": lambda: _sentencepiece("metaspace"),
}
_CACHE: dict[str, Tokenizer] = {}


def _tokenizer(name: str) -> Tokenizer:
    if name not in _CACHE:
        _CACHE[name] = TOKENIZERS[name]()
    return _CACHE[name]


def _streamed(tok: Tokenizer, ids: list[int], skip_special: bool = True) -> list[str]:
    decoder = tok.stream_decoder(skip_special=skip_special)
    return [decoder.push(token) for token in ids] + [decoder.flush()]


# ------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("text", TRICKY)
def test_pieces_of_tricky_text_concatenate_to_the_decode(name, text):
    tok = _tokenizer(name)
    ids = tok.encode(text)
    for skip_special in (True, False):
        pieces = _streamed(tok, ids, skip_special)
        assert "".join(pieces) == tok.decode(ids, skip_special=skip_special)
    if name == "byte_level":
        assert "".join(_streamed(tok, ids)) == text  # byte-level BPE round-trips any text


@pytest.mark.parametrize("name", TOKENIZERS)
@FUZZ
@given(data=st.data())
def test_any_id_sequence_streams_to_its_decode(name, data):
    # Models emit any ids: bytes that never make a character, control tokens mid-text, a
    # real token after a run of byte-fallback ones, ids past the tokenizer (padding rows).
    tok = _tokenizer(name)
    specials = [tid for tid, (_, special) in tok.added_tokens().items() if special]
    token = st.one_of(
        st.integers(0, tok.vocab_size + 3),
        st.sampled_from(specials),
        st.integers(FIRST_BYTE_ID, FIRST_BYTE_ID + 255),  # byte tokens of the SP tokenizers
    )
    ids = data.draw(st.lists(token, max_size=30))
    if data.draw(st.booleans()):
        text = data.draw(st.text(max_size=12))
        at = data.draw(st.integers(0, len(ids)))
        ids[at:at] = tok.encode(text)
    skip_special = data.draw(st.booleans())
    assert "".join(_streamed(tok, ids, skip_special)) == tok.decode(ids, skip_special=skip_special)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("text", TRICKY)
def test_each_piece_comes_as_soon_as_its_text_is_final(name, text):
    # Final: the decode does not end inside a character, and (byte fallback) the last token
    # is not a <0xNN> one, whose run a later byte could still turn into U+FFFDs.
    tok = _tokenizer(name)
    byte_ids = SP_BYTE_IDS if name != "byte_level" else frozenset()
    ids = tok.encode(text)
    decoder = tok.stream_decoder()
    emitted = ""
    held = 0
    for i, token in enumerate(ids):
        emitted += decoder.push(token)
        full = tok.decode(ids[: i + 1])
        final = not full.endswith("\ufffd") and token not in byte_ids
        assert decoder.pending is not final
        assert emitted == full if final else full.startswith(emitted)
        held += not final
    assert held or text.isascii(), "a non-ASCII character should span tokens somewhere"


def test_a_byte_run_is_held_until_it_closes():
    # E6 97 A5 is 日, but the ByteFallback decoder turns the run E6 97 A5 FF into four U+FFFDs:
    # emitting 日 after its third byte would have been wrong once FF followed.
    tok = _sentencepiece("strip")
    byte = {b: FIRST_BYTE_ID + b for b in range(256)}
    x = tok.vocab()["x"]
    ids = [tok.vocab()["▁a"], byte[0xE6], byte[0x97], byte[0xA5], byte[0xFF], x]
    assert tok.decode(ids) == "a\ufffd\ufffd\ufffd\ufffdx"
    assert _streamed(tok, ids) == ["a", "", "", "", "", "\ufffd\ufffd\ufffd\ufffdx", ""]
    valid = [byte[0xE6], byte[0x97], byte[0xA5], x]
    assert _streamed(tok, valid) == ["", "", "", "日x", ""]
    assert _streamed(tok, valid[:3]) == ["", "", "", "日"]  # flush: the end closes the run


def test_a_stripped_leading_space_stays_stripped_only_at_the_start():
    # The decoder strips the text's first space: a window that starts after a control token
    # must not strip the space of the word that follows it.
    for style in ("strip", "metaspace"):
        tok = _sentencepiece(style)
        ids = tok.encode("hello world hello", add_special=True)
        assert ids[0] == 1  # <s>, added by the post-processor
        ids[2:2] = [2, 2]  # </s> twice in the middle
        assert "".join(_streamed(tok, ids)) == tok.decode(ids) == "hello world hello"


# ------------------------------------------------------------------------------ cost


class _CountingTokenizer(Tokenizer):
    """The tiny tokenizer, counting how many ids its decode is asked for."""

    decoded_ids = 0
    widest = 0

    def decode(self, ids, *, skip_special=True):
        self.decoded_ids += len(ids)
        self.widest = max(self.widest, len(ids))
        return super().decode(ids, skip_special=skip_special)


def test_streaming_decodes_a_bounded_window_per_token():
    tok = _CountingTokenizer.from_folder(tiny_model_dir("llama", seed=0))
    ids = tok.encode(" ".join(TRICKY) * 20)
    assert len(ids) > 2000
    decoder = tok.stream_decoder()
    text = "".join(decoder.push(token) for token in ids) + decoder.flush()
    assert text == Tokenizer.decode(tok, ids)
    # A window is the last piece's ids plus the held ones: a character is at most 4 byte tokens.
    assert tok.widest <= 8
    assert tok.decoded_ids <= 2 * 8 * len(ids)  # linear; re-decoding everything: ~n²/2


# ------------------------------------------------------------------------------ Client.stream


def _pieces_by_full_decode(tok: Tokenizer, tokens: list[int], stop: str) -> list[tuple[str, int]]:
    """Client.stream's assembly before StreamDecoder: decode everything after every token."""
    out, text = [], ""
    for i, token in enumerate(tokens):
        full = tok.decode(tokens[: i + 1])
        if full.endswith("\ufffd"):
            continue
        piece, text = full[len(text) :], full
        if stop and stop in text:
            break
        out.append((piece, token))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_client_stream_pieces_are_unchanged(tiny_model, seed):
    # Sampled at temperature 1 the tiny model emits stray bytes and split characters.
    client = Client(tiny_model, history=HistoryStore(memory=True))
    params = dict(method="slm", max_new_tokens=60, temperature=1.0, seed=seed)
    stream = client.stream("Budget for the next quarter", **params)
    pieces = list(stream)
    first = stream.result
    tokens = first.tokens
    assert [(p.text, p.token) for p in pieces] == _pieces_by_full_decode(
        tiny_model.tokenizer, tokens, ""
    )
    assert first.text == tiny_model.tokenizer.decode(tokens)
    stop = first.text[len(first.text) // 2 :][:2]
    if stop:
        stream = client.stream("Budget for the next quarter", stop=[stop], **params)
        pieces = list(stream)
        expected = _pieces_by_full_decode(tiny_model.tokenizer, tokens, stop)
        assert [(p.text, p.token) for p in pieces] == expected
        assert stream.result.text == first.text[: first.text.find(stop)]
