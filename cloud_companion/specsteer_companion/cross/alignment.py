"""Byte-level alignment of two tokenizers, for SpecSteer across mismatched vocabularies.

Owns everything that turns "two token sequences" into "one byte string": the bytes of every
token id (byte-level BPE, SentencePiece '▁'/<0xNN> byte fallback, added tokens), where a
tokenization puts its boundaries, which of them a continuation of a cut-off text could still move
(the prompt-boundary problem), the per-pair lookup tables (for each token of one vocabulary, the
tokens of the other that start with it, that are proper prefixes of it, and the first token the
other tokenizer would emit for it), and the pure maths that re-expresses one model's next-token
distribution in the other's vocabulary (`walk`). See docs/cross-tokenizer.md.

It must not load models or hold session state: inputs are tokenizers, token ids, byte strings
and log-probability rows (numpy), outputs are numbers. Its only I/O is its own table cache:
tables are built once per tokenizer (pair), kept for the life of the process and saved under
$SPECSTEER_HOME/alignment, keyed by vocabulary content hashes.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from specsteer.models.registry import home
from specsteer.tokenizer import Tokenizer

__all__ = [
    "PairTables",
    "TokenTable",
    "common_boundaries",
    "encode_bytes",
    "ends_of",
    "pair_tables",
    "settle",
    "settled_end",
    "token_table",
    "utf8_complete",
]

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Continuations that expose the ways a tokenizer re-splits the end of a text beyond its last
# pre-token: letters (words grow; "'v" + "e" is the contraction "'ve", "'l" + "l" is "'ll"), a
# digit, whitespace (runs merge: "\n" + " " + "\n"), punctuation ("(" + "abc" is one pre-token),
# a combining accent (NFC), a CJK character and an emoji (multi-byte merges).
_PROBES = ("a", "e", "l", "A", "0", " ", "\n", "\t", ".", "-", "'s", "\u0301", "東", "\U0001f600")
_PROBE_WINDOW = 256  # bytes of context re-tokenized with each probe (boundaries further back hold)


# --------------------------------------------------------------------------------- token bytes


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: byte-level BPE writes byte b as this character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_LEVEL = _byte_level_alphabet()


def _scheme(decoder_config: dict | None) -> str:
    """How this tokenizer writes bytes in its token strings: byte_level, sentencepiece or plain."""
    decoder = json.dumps(decoder_config, ensure_ascii=False)
    if '"ByteLevel"' in decoder:
        return "byte_level"
    if '"ByteFallback"' in decoder or "\u2581" in decoder or '"Metaspace"' in decoder:
        return "sentencepiece"
    return "plain"


def _piece(token: str, scheme: str) -> bytes:
    if scheme == "byte_level":
        if all(c in _BYTE_LEVEL for c in token):
            return bytes(_BYTE_LEVEL[c] for c in token)
        return token.encode()
    if scheme == "sentencepiece":
        m = _BYTE_FALLBACK.fullmatch(token)
        if m:
            return bytes([int(m.group(1), 16)])
        return token.replace("\u2581", " ").encode()
    return token.encode()


@dataclass(eq=False)
class TokenTable:
    """The bytes of every token id of one tokenizer, padded to the model's row width.

    pieces[i] is the text token i stands for (added tokens: their content; control tokens: their
    content too, so that boundary arithmetic over a tokenization that contains one stays exact).
    `special` marks ids that are not text (control tokens and ids past the tokenizer, e.g. the
    padding rows of Qwen's 151,936-wide output): they never take part in byte matching.
    """

    tokenizer: Tokenizer
    pieces: list[bytes]
    special: np.ndarray  # bool [size]
    size: int
    scheme: str

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(p) for p in self.pieces), dtype=np.int64, count=self.size)

    @cached_property
    def by_piece(self) -> dict[bytes, int]:
        """Text token id of each byte string (the lowest id wins when two ids share bytes)."""
        out: dict[bytes, int] = {}
        for i, p in enumerate(self.pieces):
            if p and not self.special[i] and p not in out:
                out[p] = i
        return out

    @cached_property
    def max_len(self) -> int:
        return max((len(p) for p in self.by_piece), default=1)

    @cached_property
    def sorted_index(self) -> tuple[list[bytes], np.ndarray]:
        """Text tokens sorted by bytes: the tokens starting with q form one contiguous range."""
        ids = [i for i, p in enumerate(self.pieces) if p and not self.special[i]]
        ids.sort(key=lambda i: self.pieces[i])
        return [self.pieces[i] for i in ids], np.asarray(ids, dtype=np.int64)

    def cover_range(self, q: bytes) -> tuple[int, int]:
        """Range of `sorted_index` holding exactly the text tokens whose bytes start with q."""
        keys, _ = self.sorted_index
        lo = bisect.bisect_left(keys, q)
        upper = _successor(q)
        hi = len(keys) if upper is None else bisect.bisect_left(keys, upper, lo)
        return lo, hi

    def cover(self, q: bytes) -> np.ndarray:
        """Ids of the text tokens whose bytes start with q (all text tokens for q == b'')."""
        lo, hi = self.cover_range(q)
        return self.sorted_index[1][lo:hi]

    def longest_prefix(self, data: bytes) -> int:
        """The longest text token that is a prefix of `data`; -1 if none."""
        for n in range(min(len(data), self.max_len), 0, -1):
            tid = self.by_piece.get(data[:n])
            if tid is not None:
                return tid
        return -1

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.pieces[i] for i in ids)


def _successor(q: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with q (None: no bound)."""
    stripped = q.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


_TABLES: dict[tuple[str, int], TokenTable] = {}
_CACHE_VERSION = 1  # bump when what the tables hold changes


def _disk_cached(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Arrays from $SPECSTEER_HOME/alignment/NAME.npz, built and saved on first use.

    Tables are keyed by vocabulary content hashes, so a cached file is never stale; building
    them costs seconds per process (Gemma: ~10 s), loading them milliseconds.
    """
    path = home() / "alignment" / f"v{_CACHE_VERSION}-{name}.npz"
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile):
        pass
    arrays = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:  # a read-only cache only costs the rebuild
        pass
    return arrays


def token_table(tokenizer: Tokenizer, size: int | None = None) -> TokenTable:
    """The TokenTable of `tokenizer`, `size` ids wide (default: its own vocabulary); cached."""
    width = max(size or 0, tokenizer.vocab_size)
    key = (tokenizer.vocab_hash, width)
    if key not in _TABLES:
        def build() -> dict[str, np.ndarray]:
            table = _build_table(tokenizer, width)
            return {"blob": np.frombuffer(b"".join(table.pieces), dtype=np.uint8),
                    "lengths": table.lengths, "special": table.special,
                    "scheme": np.array(table.scheme)}

        arrays = _disk_cached(f"{tokenizer.vocab_hash[:24]}-{width}", build)
        blob, cuts = arrays["blob"].tobytes(), np.concatenate([[0], np.cumsum(arrays["lengths"])])
        pieces = [blob[cuts[i]: cuts[i + 1]] for i in range(width)]
        _TABLES[key] = TokenTable(tokenizer, pieces, arrays["special"].astype(bool), width,
                                  str(arrays["scheme"]))
    return _TABLES[key]


def _build_table(tokenizer: Tokenizer, size: int) -> TokenTable:
    scheme = _scheme(tokenizer.decoder_config())
    pieces = [b""] * size
    special = np.ones(size, dtype=bool)
    for token, tid in tokenizer.vocab(with_added=False).items():
        if tid < size:
            pieces[tid] = _piece(token, scheme)
            special[tid] = False
    for tid, (content, is_special) in tokenizer.added_tokens().items():
        if tid < size:
            pieces[tid] = content.encode()  # added tokens match raw text, not byte-level
            special[tid] = is_special
    return TokenTable(tokenizer, pieces, special, size, scheme)


# ------------------------------------------------------------------------------ boundaries


def utf8_complete(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character.

    Only the last 3 bytes can belong to an unfinished character; anything else is left to the
    decoder (invalid bytes count as complete, as a tokenizer would see them replaced).
    """
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n


def encode_bytes(table: TokenTable, data: bytes) -> list[int]:
    """Token ids that spell exactly `data`, even where it is not valid UTF-8.

    A tokenizer takes text; a model may emit any bytes. Valid stretches are tokenized as text,
    each invalid byte becomes that vocabulary's single-byte token (byte-level BPE: the byte's
    own token; SentencePiece: <0xNN>). Stops early if the vocabulary has no such token.
    Pass complete text: an unfinished character at the end counts as invalid bytes here.
    """
    ids: list[int] = []
    while data:
        try:
            text, bad, rest = data.decode("utf-8"), b"", b""
        except UnicodeDecodeError as err:
            text, bad, rest = data[: err.start].decode("utf-8"), data[err.start: err.end], \
                data[err.end:]
        if text:
            ids.extend(table.tokenizer.encode(text))
        for b in bad:
            tid = table.by_piece.get(bytes([b]))
            if tid is None:
                return ids
            ids.append(tid)
        data = rest
    return ids


def ends_of(table: TokenTable, ids: Sequence[int]) -> np.ndarray:
    """Byte offset of the end of each token of a tokenization (its boundaries after 0)."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64)
    return np.cumsum(table.lengths[np.asarray(ids, dtype=np.int64)])


def common_boundaries(a: np.ndarray, b: np.ndarray, upto: int) -> np.ndarray:
    """Byte offsets in (0, upto] that are boundaries of both tokenizations, ascending."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    both = np.intersect1d(a[a <= upto], b[b <= upto])
    return both[both > 0]


def settled_end(table: TokenTable, data: bytes, ids: Sequence[int]) -> int:
    """Byte offset up to which the boundaries of `ids` = encode_bytes(data) survive more text.

    The last token of a cut-off text is never final (" hel" may become " hello"), and pre-token
    rules can reach further back ("(" + "abc" is one pre-token, "\\n" + " " + "\\n" merge). The
    text is re-tokenized with a set of probe continuations; boundaries that every probe keeps,
    before the start of the last pre-token and of the last token, are settled. Only the last
    `_PROBE_WINDOW` bytes are re-tokenized (from a boundary on a character start), so the cost
    does not grow with the text.
    """
    return settle(table, data, ids)[0]


def settle(table: TokenTable, data: bytes, ids: Sequence[int]) -> tuple[int, list[list[int]]]:
    """`settled_end`, plus the other ways the unsettled end may be tokenized in context.

    Each alternative is `ids` up to the probe window followed by a probe's tokenization cut to
    the tokens that end within `data`: "\\n\\n" at the end of a text is one token, but "\\n",
    "\\n" when a word follows — which is how a model that has seen the word coming splits it.
    """
    ends = ends_of(table, ids)
    if not len(ends):
        return 0, []
    last_start = int(ends[-2]) if len(ends) > 1 else 0
    j = int(np.searchsorted(ends, len(data) - _PROBE_WINDOW, side="right")) - 1
    while j >= 0 and int(ends[j]) < len(data) and 0x80 <= data[int(ends[j])] < 0xC0:
        j -= 1  # start the window on a character, or decoding it would change its bytes
    ws = int(ends[j]) if j >= 0 else 0
    head = list(ids[: j + 1])
    window = data[ws:]
    base_ends = ends_of(table, encode_bytes(table, window))
    settled = min(last_start, _last_word_start(table, data, ws)) - ws
    alternatives: list[list[int]] = []
    for probe in _PROBES:
        p_ids = encode_bytes(table, window + probe.encode())
        p_ends = ends_of(table, p_ids)
        n = min(len(base_ends), len(p_ends))
        diff = np.flatnonzero(base_ends[:n] != p_ends[:n])
        first = int(diff[0]) if diff.size else n
        settled = min(settled, int(base_ends[first - 1]) if first > 0 else 0)
        inside = int(np.searchsorted(p_ends, len(window), side="right"))
        alt = head + list(p_ids[:inside])
        if alt != list(ids) and alt not in alternatives:
            alternatives.append(alt)
    return ws + max(0, settled), alternatives


_SPACE = frozenset(b" \t\n\r\x0b\x0c")


def _last_word_start(table: TokenTable, data: bytes, ws: int) -> int:
    """Byte offset where the last pre-token (word) of `data` starts; BPE may re-split it whole.

    Uses the tokenizer's own pre-tokenizer where it splits raw text (byte-level BPE); otherwise
    (SentencePiece, whose pre-tokenizer sees '▁' after normalisation) the last whitespace-led
    word, or the trailing whitespace run.
    """
    if table.scheme == "byte_level":
        try:
            text = data[ws:].decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text:
            pieces = table.tokenizer.pre_tokenize(text)
            if pieces:
                return ws + len(text[: pieces[-1][1][0]].encode())
    i = len(data)
    trailing_space = i > 0 and data[i - 1] in _SPACE
    while i > 0 and (data[i - 1] in _SPACE) == trailing_space:
        i -= 1
    if not trailing_space and i > 0:
        i -= 1  # the space that leads the word belongs to it ("▁word", " word")
        while i > 0 and data[i - 1] in _SPACE:
            i -= 1
    return i


# ------------------------------------------------------------------------------ pair tables


@dataclass(eq=False)
class PairTables:
    """Lookup tables between a Specialist vocabulary `s` and a Generalist vocabulary `g`.

    Built once per pair (`pair_tables`). first_s[g] is the S token the Specialist's tokenizer
    emits first for G token g's bytes (its image in S space; control tokens map by content, and
    end-of-text markers to the Specialist's end-of-text), -1 when there is none.
    """

    s: TokenTable
    g: TokenTable
    first_s: np.ndarray  # int64 [g.size]
    s_eos_main: int
    s_eos: frozenset[int]
    g_eos: np.ndarray  # G ids whose image is an S end-of-text
    _first_cache: dict[bytes, int] = field(default_factory=dict)

    @cached_property
    def _mapped(self) -> tuple[np.ndarray, np.ndarray]:
        g_ids = np.flatnonzero(self.first_s >= 0)
        return g_ids, self.first_s[g_ids]

    def first_token(self, data: bytes) -> int:
        """The S token the Specialist's tokenizer emits first for `data` (cached)."""
        tid = self._first_cache.get(data)
        if tid is None:
            tid = _first_token(self.s, data)
            self._first_cache[data] = tid
        return tid

    @cached_property
    def cover_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(s, g) pairs where G token g's bytes start with S token s's bytes (prefix tables)."""
        keys, order = self.g.sorted_index
        s_ids, spans = [], []
        for piece, sid in self.s.by_piece.items():
            lo, hi = self.g.cover_range(piece)
            if hi > lo:
                s_ids.append(np.full(hi - lo, sid, dtype=np.int64))
                spans.append(order[lo:hi])
        if not s_ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(s_ids), np.concatenate(spans)

    @cached_property
    def proper_prefix_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(s, g) pairs where G token g's bytes are a proper prefix of S token s's bytes.

        These are the ways the Generalist can start an S token it has no single token for;
        the probability of what follows g needs another Generalist step (see `uncertain_g`).
        """
        s_out, g_out = [], []
        for piece, sid in self.s.by_piece.items():
            for n in range(1, len(piece)):
                gid = self.g.by_piece.get(piece[:n])
                if gid is not None:
                    s_out.append(sid)
                    g_out.append(gid)
        return np.asarray(s_out, np.int64), np.asarray(g_out, np.int64)

    @cached_property
    def uncertain_g(self) -> np.ndarray:
        """bool [g.size]: G tokens whose S image could be a longer S token the G vocabulary lacks.

        Mapping g to first_s[g] assumes the Specialist's next token ends within g. That fails
        only if some S token extends g's bytes and the Generalist has no such token (had it
        one, its canonical tokenization would have used it). The mass on these tokens bounds the
        error of the one-step mapping: it is the coverage figure reported by the session.
        """
        s_keys, s_order = self.s.sorted_index
        missing = np.fromiter((self.g.by_piece.get(k) is None for k in s_keys), dtype=np.int64,
                              count=len(s_keys))
        cum = np.concatenate([[0], np.cumsum(missing)])
        out = np.zeros(self.g.size, dtype=bool)
        for gid in np.flatnonzero(~self.g.special):
            piece = self.g.pieces[gid]
            if not piece:
                continue
            lo, hi = self.s.cover_range(piece)
            out[gid] = cum[hi] - cum[lo] > 0
        return out

    def token_mass(self, p: np.ndarray) -> np.ndarray:
        """A G probability row summed onto each G token's S image: float64 [s.size]."""
        g_ids, s_ids = self._mapped
        return np.bincount(s_ids, weights=p[g_ids], minlength=self.s.size)

    def prefix_mass(self, p: np.ndarray) -> np.ndarray:
        """For each S token s: P_G(next G token's bytes start with s), float64 [s.size].

        Includes the end-of-text and control-token images like `token_mass` does.
        """
        s_ids, g_ids = self.cover_pairs
        out = np.bincount(s_ids, weights=p[g_ids], minlength=self.s.size)
        ctrl = np.flatnonzero(self.g.special & (self.first_s >= 0))
        np.add.at(out, self.first_s[ctrl], p[ctrl])
        return out


def _first_token(table: TokenTable, data: bytes) -> int:
    """First token of the tokenization of `data` (longest prefix when it is not valid text)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return table.longest_prefix(data)
    ids = table.tokenizer.encode(text)
    if ids and table.pieces[ids[0]] and data.startswith(table.pieces[ids[0]]) \
            and not table.special[ids[0]]:
        return int(ids[0])
    return table.longest_prefix(data)


_PAIRS: dict[tuple[str, int, str, int], PairTables] = {}


def pair_tables(s_tok: Tokenizer, g_tok: Tokenizer, s_size: int | None = None,
                g_size: int | None = None) -> PairTables:
    """The PairTables of Specialist tokenizer `s_tok` and Generalist tokenizer `g_tok`; cached."""
    s = token_table(s_tok, s_size)
    g = token_table(g_tok, g_size)
    key = (s_tok.vocab_hash, s.size, g_tok.vocab_hash, g.size)
    if key not in _PAIRS:
        def build() -> dict[str, np.ndarray]:
            pair = _build_pair(s, g, None)
            return {"first_s": pair.first_s, "uncertain_g": pair.uncertain_g}

        name = f"{s_tok.vocab_hash[:24]}-{s.size}-{g_tok.vocab_hash[:24]}-{g.size}"
        arrays = _disk_cached(name, build)
        pair = _build_pair(s, g, arrays["first_s"])
        pair.__dict__["uncertain_g"] = arrays["uncertain_g"].astype(bool)  # the cached_property
        _PAIRS[key] = pair
    return _PAIRS[key]


def _main_eos(s: TokenTable) -> int:
    """The end-of-text id the Specialist ends a chat turn with (what its device loop expects)."""
    eos = sorted(s.tokenizer.eos_ids)
    for marker in (b"<|im_end|>", b"<end_of_turn>", b"<|endoftext|>", b"<eos>", b"</s>"):
        for tid in eos:
            if tid < s.size and s.pieces[tid] == marker:
                return tid
    return eos[0] if eos else -1


def _build_pair(s: TokenTable, g: TokenTable, first: np.ndarray | None) -> PairTables:
    """The pair's tables; `first` (the images of G's text tokens) is computed if not given."""
    if first is None:
        first = _text_images(s, g)
    first = first.astype(np.int64, copy=True)
    # control tokens: the same content on both sides, end-of-text markers onto each other
    s_eos = frozenset(t for t in s.tokenizer.eos_ids if t < s.size)
    main = _main_eos(s)
    s_controls = {s.pieces[i]: i for i in np.flatnonzero(s.special) if s.pieces[i]}
    g_eos_set = {t for t in g.tokenizer.eos_ids if t < g.size}
    for gid in np.flatnonzero(g.special):
        piece = g.pieces[gid]
        if piece and piece in s_controls:
            first[gid] = s_controls[piece]
        elif gid in g_eos_set and main >= 0:
            first[gid] = main
    g_eos = np.asarray([i for i in np.flatnonzero(g.special) if first[i] in s_eos],
                       dtype=np.int64)
    return PairTables(s, g, first, main, s_eos, g_eos)


def _text_images(s: TokenTable, g: TokenTable) -> np.ndarray:
    """first_s for G's text tokens (control tokens stay -1): one batched S tokenization."""
    first = np.full(g.size, -1, dtype=np.int64)
    text_ids = [i for i in range(g.size) if g.pieces[i] and not g.special[i]]
    valid, texts = [], []
    for gid in text_ids:
        try:
            texts.append(g.pieces[gid].decode("utf-8"))
            valid.append(gid)
        except UnicodeDecodeError:
            first[gid] = s.longest_prefix(g.pieces[gid])
    for gid, ids in zip(valid, s.tokenizer.encode_batch(texts), strict=True):
        head = ids[0] if ids else -1
        ok = head >= 0 and not s.special[head] and g.pieces[gid].startswith(s.pieces[head])
        first[gid] = head if ok else s.longest_prefix(g.pieces[gid])
    return first
