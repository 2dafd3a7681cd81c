"""Cross-tokenizer SpecSteer: byte alignment, the walk, and sessions against brute force.

Tokenizer-level tests run on every tokenizer available: the tiny test tokenizers always, and the
real ones (SmolLM2, Qwen2.5, Gemma-3) when their compiled folders are in the cache (with CI=true
they are fetched and compiled here; a model that cannot be is a failure). Session tests
use a tiny pair with different vocabularies (512 vs 384 merges of the same corpus) and compare
the incremental companion session, round after round, with a from-scratch reference that scores
full token sequences in fresh model sessions and sums probabilities over the whole vocabulary.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers.ci import IN_CI, skip_or_fail
from helpers.privacy_audit import assert_canary_not_sent

from specsteer import protocol
from specsteer.client import Client
from specsteer.errors import ModelError
from specsteer.models.registry import PRECISIONS, compiled_dir, get_spec
from specsteer.models.tiny import tiny_model_dir
from specsteer.protocol import OpenSession, SessionSettings
from specsteer.runtime import OnnxModel, load_model
from specsteer.tokenizer import Message, Tokenizer
from specsteer_companion.cross import CrossVerifierSession, generalist_prompt, parse_chatml
from specsteer_companion.cross import alignment as al
from specsteer_companion.cross.walk import walk
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier, VerifierSession

pytestmark = pytest.mark.slow  # alignment tables of real tokenizers: not in ./dev test --fast

TRICKY = [
    "Hello  world\n\nZürich 東京 😀 x=1234; naïve café — “quotes” ½ Ångström",
    "def f(x):\n    return x**2  # ok\n\t\ttabs (parens) [brackets] {braces}\n\n\n  end",
    "I'd've said it's the U.S.A.'s 3.14159e-10 value... 12,345,678 dollars!!! ?!",
    "東京都は日本の首都です。人口は約1400万人。😀👩‍👩‍👧 🇫🇷 emoji run",
    "   leading    and trailing   \r\n windows line\r\nend",
    "Dear team, thank you for the meeting notes. I will send the revised draft by Friday.",
]


# ------------------------------------------------------------------------------ fixtures


def _real_folder(name: str) -> Path | None:
    for precision in PRECISIONS:
        folder = compiled_dir(get_spec(name), precision)
        if (folder / "tokenizer.json").is_file() and (folder / "specsteer.json").is_file():
            return folder
    return None


def _tokenizer(name: str) -> Tokenizer:
    if name.startswith("tiny"):
        vocab = int(name.removeprefix("tiny"))
        return Tokenizer.from_folder(tiny_model_dir("llama", seed=0, vocab=vocab))
    folder = _real_folder(name)
    if folder is None and IN_CI:  # CI compiles what a later test would compile anyway
        from specsteer.models.compile import compile_model
        from specsteer.models.fetch import fetch

        try:
            fetch(name)
            folder = compile_model(name, "int8")
        except ModelError as exc:
            skip_or_fail(f"{name} could not be fetched or compiled: {exc}")
    if folder is None:
        pytest.skip(f"{name} is not compiled here (specsteer models compile {name})")
    template = get_spec(name).chat_template
    return Tokenizer.from_folder(folder, chat_template=template)


TOKENIZERS = ["tiny512", "tiny384", "smollm2-135m", "qwen2.5-1.5b", "gemma3-270m"]
PAIRS = [("tiny512", "tiny384"), ("tiny384", "tiny512"), ("smollm2-135m", "qwen2.5-1.5b"),
         ("smollm2-135m", "gemma3-270m")]


@pytest.fixture(scope="module")
def cross_generalist() -> OnnxModel:
    """A tiny Generalist whose tokenizer has 384 tokens where the tiny Specialist's has 512."""
    return load_model(tiny_model_dir("llama", seed=1, vocab=384))


@pytest.fixture(scope="module")
def cross_verifier(tiny_model, cross_generalist) -> Verifier:
    return Verifier(cross_generalist, tiny_model)


# ------------------------------------------------------------------------------ token bytes


@pytest.mark.parametrize("name", TOKENIZERS)
def test_token_bytes_spell_every_tokenization(name):
    """Concatenated token bytes give back the exact text: emoji, CJK, code, runs, accents."""
    tok = _tokenizer(name)
    table = al.token_table(tok)
    for text in TRICKY:
        ids = tok.encode(text)
        assert table.bytes_of(ids) == text.encode(), (name, text)
        assert tok.decode(ids, skip_special=False) == text
        ends = al.ends_of(table, ids)
        assert ends[-1] == len(text.encode()) and np.all(np.diff(ends) > 0)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_encode_bytes_spells_invalid_utf8(name):
    tok = _tokenizer(name)
    table = al.token_table(tok)
    data = "ok é".encode() + b"\xa2\xe6" + "東京 tail".encode() + b"\xe6"  # bytes a model can emit
    ids = al.encode_bytes(table, data)
    assert table.bytes_of(ids) == data


def test_utf8_complete():
    emoji = "😀".encode()
    assert al.utf8_complete(b"abc") == 3
    for cut in range(1, 4):
        assert al.utf8_complete(b"ab" + emoji[:cut]) == 2
    assert al.utf8_complete(b"ab" + emoji) == 6
    assert al.utf8_complete("é".encode()[:1]) == 0
    assert al.utf8_complete(b"\xa2x") == 2  # a stray continuation byte is not waited for


@pytest.mark.parametrize("name", TOKENIZERS)
def test_settled_boundaries_survive_the_rest_of_the_text(name):
    """Every boundary before settled_end(prefix) is a boundary of the whole text's tokenization."""
    tok = _tokenizer(name)
    table = al.token_table(tok)
    unsettled = checked = 0
    for text in TRICKY:
        data = text.encode()
        whole = set(al.ends_of(table, al.encode_bytes(table, data)).tolist())
        for cut in range(1, len(data)):
            if 0x80 <= data[cut] < 0xC0:
                continue
            ids = al.encode_bytes(table, data[:cut])
            settled = al.settled_end(table, data[:cut], ids)
            assert settled <= cut
            kept = [e for e in al.ends_of(table, ids).tolist() if e <= settled]
            assert set(kept) <= whole, (name, data[:cut], data[cut:cut + 8])
            unsettled += cut - settled
            checked += 1
    assert unsettled / checked < 8  # about one token stays open, not the whole text


def test_common_boundaries():
    assert al.common_boundaries(np.array([2, 5, 9, 12]), np.array([5, 7, 12]), 11).tolist() == [5]
    assert al.common_boundaries(np.array([2, 5, 9, 12]), np.array([5, 7, 12]), 12).tolist() \
        == [5, 12]


# ------------------------------------------------------------------------------ pair tables


@pytest.mark.parametrize("s_name,g_name", PAIRS)
def test_pair_tables_against_brute_force(s_name, g_name):
    s_tok, g_tok = _tokenizer(s_name), _tokenizer(g_name)
    pair = al.pair_tables(s_tok, g_tok)
    rng = np.random.default_rng(0)
    text_g = [i for i in range(pair.g.size) if pair.g.pieces[i] and not pair.g.special[i]]
    for gid in rng.choice(text_g, size=min(300, len(text_g)), replace=False):
        piece = pair.g.pieces[gid]
        sid = int(pair.first_s[gid])
        assert sid >= 0 and piece.startswith(pair.s.pieces[sid])
        try:  # the image is what the Specialist's tokenizer writes first for these bytes
            assert sid == s_tok.encode(piece.decode("utf-8"))[0]
        except UnicodeDecodeError:
            assert sid == pair.s.longest_prefix(piece)
    # cover ranges hold exactly the tokens starting with a prefix
    for q in [b" t", b"e", "é".encode()[:1], b"\n", b"1", b"Th", b" the"]:
        expected = {i for i in text_g if pair.g.pieces[i].startswith(q)}
        assert set(pair.g.cover(q).tolist()) == expected
    s_ids, g_ids = pair.proper_prefix_pairs
    for s, g in zip(s_ids[:200].tolist(), g_ids[:200].tolist(), strict=True):
        assert len(pair.g.pieces[g]) < len(pair.s.pieces[s])
        assert pair.s.pieces[s].startswith(pair.g.pieces[g])


@pytest.mark.parametrize("g_name,markers", [
    ("qwen2.5-1.5b", {"<|im_end|>": "<|im_end|>", "<|endoftext|>": "<|endoftext|>",
                      "<|im_start|>": "<|im_start|>"}),
    ("gemma3-270m", {"<end_of_turn>": "<|im_end|>", "<eos>": "<|im_end|>"}),
])
def test_control_tokens_map_explicitly(g_name, markers):
    s_tok, g_tok = _tokenizer("smollm2-135m"), _tokenizer(g_name)
    pair = al.pair_tables(s_tok, g_tok)
    g_vocab = g_tok.vocab()
    s_vocab = s_tok.vocab()
    for g_marker, s_marker in markers.items():
        assert pair.first_s[g_vocab[g_marker]] == s_vocab[s_marker]
    assert pair.s_eos_main == s_vocab["<|im_end|>"]
    assert set(pair.g_eos.tolist()) >= {g_vocab[m] for m in markers if m != "<|im_start|>"}


# ------------------------------------------------------------------------------ the walk


def _brute_walk(pair: al.PairTables, rows: list[np.ndarray], path: list[int], q: bytes,
                mode: str) -> tuple[np.ndarray, float]:
    """walk() by definition: loops over the whole vocabulary, tokenizes with the S tokenizer."""
    s_tok = pair.s.tokenizer

    def first(data: bytes) -> int:
        try:
            return s_tok.encode(data.decode("utf-8"))[0]
        except UnicodeDecodeError:
            return pair.s.longest_prefix(data)

    def credit(probs: np.ndarray, data: bytes, mass: float) -> None:
        if mode == "token":
            probs[first(data)] += mass
            return
        for sid in range(pair.s.size):
            piece = pair.s.pieces[sid]
            if piece and not pair.s.special[sid] and data.startswith(piece):
                probs[sid] += mass

    probs, prefix, w, rest, at_end = np.zeros(pair.s.size), 0.0, 1.0, q, 0.0
    for i, lp in enumerate(rows):
        p = np.exp(lp.astype(np.float64))
        tok = path[i] if i < len(path) else None
        if not rest:  # the next token after the path; other routes to here continue likewise
            prefix += w
            for g in range(pair.g.size):
                if pair.g.special[g]:
                    if pair.first_s[g] >= 0:
                        probs[pair.first_s[g]] += (w + at_end) * p[g]
                elif pair.g.pieces[g]:
                    credit(probs, pair.g.pieces[g], (w + at_end) * p[g])
            break
        for g in range(pair.g.size):
            piece = pair.g.pieces[g]
            if g == tok or pair.g.special[g] or not piece.startswith(rest):
                continue
            prefix += w * p[g]
            if len(piece) > len(rest):
                credit(probs, piece[len(rest):], w * p[g])
            else:
                at_end += w * p[g]
        if tok is None:
            break
        w *= p[tok]
        rest = rest[len(pair.g.pieces[tok]):]
    return probs, prefix


@pytest.mark.parametrize("s_name,g_name", PAIRS[:2])
@pytest.mark.parametrize("mode", ["token", "prefix"])
def test_walk_equals_brute_force(s_name, g_name, mode):
    pair = al.pair_tables(_tokenizer(s_name), _tokenizer(g_name))
    rng = np.random.default_rng(1)
    for text in [b" the report", b"Dear team,", "é t\xc3\xa9 ok".encode(), b"0123 \n\n"]:
        ids = al.encode_bytes(pair.g, text)
        ends = al.ends_of(pair.g, ids)
        for cut in range(len(text) + 1):
            path = [t for t, e in zip(ids, ends, strict=True) if e <= cut]
            z = rng.normal(0.0, 3.0, (len(path) + 1, pair.g.size))
            rows = list((z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(np.float32))
            got = walk(pair, rows, path, text[:cut], mode=mode, cap=10**6, floor=0.0)
            probs, prefix = _brute_walk(pair, rows, path, text[:cut], mode)
            assert got.prefix == pytest.approx(prefix, rel=1e-9, abs=1e-12)
            np.testing.assert_allclose(got.probs, probs, rtol=1e-9, atol=1e-12)
            if mode == "token":  # a distribution: every continuation counted once
                assert got.probs.sum() <= got.prefix * (1 + 1e-6)  # rows are float32


def test_prefix_mode_favours_short_tokens_token_mode_does_not(tiny_model):
    """Why recovery defaults to "token": P(starts with " t") >= P(starts with " the") always."""
    s_tok = tiny_model.tokenizer
    pair = al.pair_tables(s_tok, _tokenizer("tiny384"))
    the = pair.g.by_piece[b" the"]
    row = np.full(pair.g.size, -30.0, np.float32)
    row[the] = 0.0
    short, long_ = pair.s.by_piece[b" t"], pair.s.by_piece[b" the"]
    prefix = walk(pair, [row], [], b"", mode="prefix").probs
    token = walk(pair, [row], [], b"", mode="token").probs
    assert prefix[short] >= prefix[long_] > 0.99
    assert token[long_] > 0.99 and token[short] < 1e-6


# ------------------------------------------------------------------------------ prompts


def test_chat_prompt_is_re_rendered_for_the_generalist(tiny_model):
    s_tok = tiny_model.tokenizer
    messages = [Message("system", "Be brief."), Message("user", "Write to Anna: 東京 😀")]
    text = s_tok.render_chat(messages)
    assert parse_chatml(text) == (messages, True)
    assert parse_chatml("no chat here") is None
    table = al.token_table(s_tok)
    plain = Tokenizer.from_folder(tiny_model.folder, chat_template="none")
    ids = generalist_prompt(table, plain, s_tok.encode(text))
    assert plain.decode(ids) == "Be brief.\n\nWrite to Anna: 東京 😀\n\n"
    same = generalist_prompt(table, s_tok, s_tok.encode(text))
    assert same == s_tok.encode(text)


def test_gemma_prompt_gets_plain_text_and_bos():
    s_tok, g_tok = _tokenizer("smollm2-135m"), _tokenizer("gemma3-270m")
    ids = generalist_prompt(al.token_table(s_tok), g_tok,
                            s_tok.chat_ids([Message("user", "Say hi to Zoë")]))
    assert g_tok.id_to_token(ids[0]) == "<bos>"
    assert g_tok.decode(ids[1:]) == "Say hi to Zoë\n\n"


# ------------------------------------------------------------------------------ sessions


def test_verifier_opens_the_text_path_only_when_tokenizers_differ(
        tiny_model, tiny_generalist, cross_verifier):
    request = OpenSession(prompt_ids=tuple(tiny_model.tokenizer.encode("Dear team")))
    same = Verifier(tiny_generalist, tiny_model).open(request)
    assert isinstance(same, VerifierSession)
    same.close()
    cross = cross_verifier.open(request)
    assert isinstance(cross, CrossVerifierSession)
    cross.close()


def test_hello_advertises_the_specialist_vocabulary(tiny_model, cross_generalist, cross_verifier):
    endpoint = CompanionEndpoint(cross_verifier)
    device = protocol.DeviceConnection()
    device.hello("", tiny_model.sha256)
    for frame in device.data_to_send():
        replies = endpoint.handle(frame)
    events = [e for f in replies for e in device.receive_frame(f)]
    ok = next(e for e in events if isinstance(e, protocol.HelloAccepted))
    assert ok.hello_ok.vocab_size == tiny_model.vocab_size != cross_generalist.vocab_size


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class _Reference:
    """One verification round recomputed from scratch for a given history and draft."""

    def __init__(self, s_model: OnnxModel, g_model: OnnxModel, pair: al.PairTables,
                 s_prompt: list[int], tail: str) -> None:
        self.s_model, self.g_model, self.pair, self.tail = s_model, g_model, pair, tail
        self.s_prompt = s_prompt
        self.g_prompt = generalist_prompt(pair.s, g_model.tokenizer, s_prompt)

    def spans(self, gen: list[int], draft: list[int]) -> list[tuple[int, int, bool, float]]:
        pair = self.pair
        text, full = pair.s.bytes_of(gen), pair.s.bytes_of(gen + draft)
        complete = al.utf8_complete(full)
        g_ids = al.encode_bytes(pair.g, full[:complete])
        assert pair.g.bytes_of(g_ids) == full[:complete]
        settled = al.settled_end(pair.g, full[:complete], g_ids)
        s_ends = np.cumsum([len(pair.s.pieces[t]) for t in gen + draft]).tolist()
        g_ends = np.cumsum([len(pair.g.pieces[t]) for t in g_ids]).tolist()
        d0, d_ends = len(text), s_ends[len(gen):]
        common = sorted(c for c in set(s_ends) & set(g_ends) if 0 < c <= settled)
        a = max([0, *(c for c in common if c <= d0)])
        spans = []
        for c in (c for c in common if c > d0):
            spans.append((a, c, False))
            a = c
        reach = [e for e in d_ends if e <= complete]
        end = reach[-1] if reach else d0
        if self.tail == "marginal" and end > a:
            spans.append((a, end, True))
        g_lp = _log_softmax(self.g_model.new_session().append(self.g_prompt + g_ids))
        before = [g_lp[len(self.g_prompt) - 1 + j] for j in range(len(g_ids) + 1)]
        s_lp = _log_softmax(self.s_model.new_session().append(self.s_prompt + gen + draft))
        ls = [s_lp[len(self.s_prompt) + len(gen) - 1 + i, t] for i, t in enumerate(draft)]
        starts = [d0, *d_ends[:-1]]

        def log_prefix(a: int, b: int) -> float:
            j = g_ends.index(a) + 1 if a else 0
            path = [g_ids[i] for i in range(j, len(g_ids)) if g_ends[i] <= b]
            _, mass = _brute_walk(pair, before[j: j + len(path) + 1], path, full[a:b], "token")
            return math.log(mass)

        out = []
        for a, b, marginal in spans:
            if marginal:
                lg = log_prefix(a, b)
            else:
                lg = sum(before[j][g_ids[j]] for j in range(len(g_ids))
                         if g_ends[j] <= b and g_ends[j] - len(pair.g.pieces[g_ids[j]]) >= a)
            if a < d0:
                lg -= log_prefix(a, d0)
            lsum = sum(x for x, s, e in zip(ls, starts, d_ends, strict=False) if s >= a and e <= b)
            out.append((a, b, marginal, lg - lsum))
        return out


@pytest.mark.parametrize("tail", ["marginal", "backoff"])
@pytest.mark.parametrize("gamma", [0.5, 0.02])
def test_session_rounds_match_a_from_scratch_reference(tiny_model, cross_generalist,
                                                       cross_verifier, tail, gamma):
    """Incremental caches, re-tokenization and span bookkeeping equal the full recomputation."""
    s_tok = tiny_model.tokenizer
    pair = al.pair_tables(s_tok, cross_generalist.tokenizer, tiny_model.vocab_size,
                          cross_generalist.vocab_size)
    checked = accepted_rounds = 0
    for query in ["Dear team, thank you", "Subject: Re: the budget", "Notes: buy milk"]:
        prompt = s_tok.chat_ids([Message("user", query)])
        ref = _Reference(tiny_model, cross_generalist, pair, prompt, tail)
        session = CrossVerifierSession(cross_verifier, OpenSession(
            prompt_ids=tuple(prompt), settings=SessionSettings(gamma=gamma, alpha=1.0)), tail=tail)
        gen: list[int] = []
        committed: list[int] = []
        for _ in range(8):
            sess = tiny_model.new_session()
            row = sess.append(prompt + gen)[-1]
            draft = []
            for _ in range(4):
                token = int(np.argmax(row))
                if token in s_tok.eos_ids:
                    break
                draft.append(token)
                row = sess.append([token])[-1]
            if not draft:
                break
            result = session.verify(committed, draft)
            expected = ref.spans(gen, draft)
            got = [(c.start, c.end, c.marginal) for c in session.last_spans]
            assert got == [e[:3] for e in expected][: len(got)]
            for check, (_, _, _, log_ratio) in zip(session.last_spans, expected, strict=False):
                assert check.log_ratio == pytest.approx(log_ratio, abs=2e-3)
            if session.last_spans and not session.last_spans[-1].accepted:
                assert expected[len(got) - 1][3] < math.log(gamma) + 2e-3
            if len(got) < len(expected):  # stopped early: the last tested span failed
                assert not session.last_spans[-1].accepted
            checked += 1
            accepted_rounds += result.accepted > 0
            n = result.accepted
            recovered = int(result.candidates.ids[int(np.argmax(result.candidates.values))])
            gen += draft[:n] + [recovered]
            committed = [recovered]
            if recovered in s_tok.eos_ids:
                break
        session.close()
    assert checked >= 10
    if gamma < 0.1:
        assert accepted_rounds > 0


def test_recovery_equals_brute_force_walk(tiny_model, cross_generalist, cross_verifier):
    """alpha = 0: the values sent are the mapped logp_G of the reference walk at the same spot,
    healed one Generalist token back (merges included), round after round."""
    s_tok = tiny_model.tokenizer
    pair = al.pair_tables(s_tok, cross_generalist.tokenizer, tiny_model.vocab_size,
                          cross_generalist.vocab_size)
    healed = 0
    for query in ["Please find attached the slides", "Abstract: Language models"]:
        prompt = s_tok.chat_ids([Message("user", query)])
        g_prompt = generalist_prompt(pair.s, cross_generalist.tokenizer, prompt)
        session = CrossVerifierSession(cross_verifier, OpenSession(
            prompt_ids=tuple(prompt), settings=SessionSettings(gamma=0.05, alpha=0.0, top_k=8)),
            merge_cap=10**6)
        text_ids = s_tok.encode(" The results of the experiment show that retrieval improves"
                                " the quality of personalized generation.")
        gen: list[int] = []
        committed: list[int] = []
        while len(gen) + 4 < len(text_ids):
            draft = text_ids[len(gen):][:4]
            result = session.verify(committed, draft)
            # the session reads committed text + draft; recovery starts after the accepted drafts
            full = pair.s.bytes_of(gen + draft)
            full = full[: al.utf8_complete(full)]
            g_ids = al.encode_bytes(pair.g, full)
            ends = al.ends_of(pair.g, g_ids).tolist()
            settled = al.settled_end(pair.g, full, g_ids)
            pos = len(pair.s.bytes_of(gen + draft[: result.accepted]))
            base = max([0, *(e for e in ends if e <= min(pos, settled) and e < pos)])
            healed += base in ends and pos in ends and base < pos
            j = ends.index(base) + 1 if base else 0
            # the path to the recovery point: its tokens as if a word followed, if that keeps
            # a boundary there, else its own tokens
            q = full[base:pos]
            probe = al.encode_bytes(pair.g, q + b"a")
            cut = [t for t, e in zip(probe, al.ends_of(pair.g, probe), strict=True) if e <= len(q)]
            path = cut if pair.g.bytes_of(cut) == q else al.encode_bytes(pair.g, q)
            context = g_ids[:j] + path
            g_lp = _log_softmax(cross_generalist.new_session().append(g_prompt + context))
            rows = [g_lp[len(g_prompt) - 1 + j + i] for i in range(len(path) + 1)]
            probs, _ = _brute_walk(pair, rows, path, full[base:pos], "token")
            with np.errstate(divide="ignore"):
                expected = np.log(probs / probs.sum())
            top = np.argsort(-expected, kind="stable")[:3]
            assert result.candidates.ids[:3].tolist() == top.tolist()
            values = result.candidates.values[:3].astype(np.float64)
            np.testing.assert_allclose(values, expected[top], atol=2e-2)
            # follow the text, not the recovery, so that the rounds stay comparable
            n = result.accepted
            nxt = text_ids[len(gen) + n]
            gen += draft[:n] + [nxt]
            committed = [nxt]
        session.close()
    assert healed >= 3  # recoveries that started one Generalist token back


# ------------------------------------------------------------------------------ end to end


SUBJECT = "Budget for the next quarter"


@pytest.mark.parametrize("params", [
    dict(), dict(gamma=0.0), dict(temperature=0.8, seed=3), dict(s0_on_device=True),
    dict(method="speculative"), dict(method="llm"), dict(method="light_costeer"),
    dict(method="costeer", costeer_iterations=3), dict(k=8, gamma=0.1),
])
def test_generations_through_the_cross_companion(tiny_model, cross_verifier, params):
    client = Client(tiny_model, history=None,
                    companion=lambda: LocalChannel.for_verifier(cross_verifier))
    result = client.generate(SUBJECT, max_new_tokens=32, offline="fail", **params)
    assert 0 < result.stats.tokens <= 32 and not result.stats.degraded
    assert all(0 <= t < tiny_model.vocab_size for t in result.tokens)
    if params.get("gamma") == 0.0:  # everything the Generalist can read is accepted
        assert result.stats.acceptance_rate > 0.5


def test_privacy_canary_never_crosses_the_wire_across_tokenizers(tiny_model, cross_verifier):
    from specsteer.history import HistoryStore

    canary = "ZQX-CANARY-7731-plover"
    store = HistoryStore(memory=True)
    store.add(kind="email", title=SUBJECT, body=f"The budget stays as it is. {canary}")
    frames: list[tuple[str, bytes]] = []
    client = Client(tiny_model, history=store,
                    companion=lambda: LocalChannel.for_verifier(cross_verifier),
                    tap=lambda d, f: frames.append((d, f)))
    result = client.generate(SUBJECT, max_new_tokens=24, offline="fail")
    assert canary in result.prompt.with_context
    # the Specialist ids sent up hold no tokenization of the canary, and the bytes they spell
    # (what the companion aligns to its own tokenizer) do not contain it
    assert_canary_not_sent(tiny_model.tokenizer, frames, canary)
