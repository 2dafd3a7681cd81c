"""The user's minimum length: no end-of-text before `min_new_tokens`, in every method, unless
the deciding model puts more than `end_release` on it.

The tiny models rarely end on their own, so the test declares one of the tokens a method
writes early to be an end-of-text id (a real model whose tokenizer lists one more stop id):
without a minimum the generation stops there, with one it must go on past it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
from helpers.declared import StopsAt, WithTokenizer, Writes

from specsteer.device import METHODS, DecodeStats, DevicePrompt, Params, decode
from specsteer.link import CompanionLink
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

PRIVATE = "Earlier notes: the budget stays flat; revised draft by Friday.\nWrite a budget note."
PUBLIC = "Write a budget note."


def _run(specialist, generalist, params: Params, stats: DecodeStats | None = None) -> list[int]:
    tok = specialist.tokenizer
    prompt = DevicePrompt(tok.encode(PRIVATE), tok.encode(PUBLIC))
    link = None
    if params.collaborative:
        real = specialist.base if isinstance(specialist, WithTokenizer) else specialist
        link = CompanionLink(LocalChannel.for_verifier(Verifier(generalist, real)))
        link.hello()
    tokens = [e.token for e in decode(specialist, prompt, params, link, stats)]
    if link is not None:
        link.close()
    return tokens


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pipeline", [True, False])
def test_no_end_of_text_before_the_minimum(tiny_model, tiny_generalist, method, pipeline):
    free = _run(tiny_model, tiny_generalist, Params(method=method, max_new_tokens=30,
                                                    pipeline=pipeline))
    stop = free[2]  # a token the method writes early: declare it an end-of-text id
    stopping = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, stop))
    short = _run(stopping, tiny_generalist, Params(method=method, max_new_tokens=30,
                                                   pipeline=pipeline))
    assert short[-1] == stop and len(short) <= 3  # without a minimum it stops right there
    held = _run(stopping, tiny_generalist, Params(method=method, max_new_tokens=30,
                                                  min_new_tokens=20, end_release=1.0,
                                                  pipeline=pipeline))
    assert stop not in held[:20]
    assert len(held) >= 20


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pipeline", [True, False])
def test_an_end_the_deciding_model_is_sure_of_is_let_through(tiny_model, tiny_generalist,
                                                             method, pipeline):
    # the same early end as above, under the same minimum: a release threshold below the
    # deciding model's probability of it lets it stand; the threshold 1 holds it back
    free = _run(tiny_model, tiny_generalist, Params(method=method, max_new_tokens=30,
                                                    pipeline=pipeline))
    stop = free[2]
    stopping = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, stop))

    def under(release: float) -> list[int]:
        return _run(stopping, tiny_generalist, Params(
            method=method, max_new_tokens=30, min_new_tokens=20, end_release=release,
            end_release_from=0, pipeline=pipeline))

    assert under(1e-9) == free[:3]
    assert len(under(1.0)) >= 20


@pytest.mark.parametrize("method", METHODS)
def test_an_end_before_half_the_minimum_is_held_however_sure(tiny_model, tiny_generalist,
                                                             method):
    # a title-length answer: at any threshold, an end at position 2 stands under a minimum
    # of 4 (released from position 2 on) but not under one of 20 (from position 10 on)
    free = _run(tiny_model, tiny_generalist, Params(method=method, max_new_tokens=30))
    stop = free[2]
    stopping = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, stop))

    def under(minimum: int) -> list[int]:
        return _run(stopping, tiny_generalist, Params(
            method=method, max_new_tokens=30, min_new_tokens=minimum, end_release=1e-9))

    assert under(4) == free[:3]
    held = under(20)
    assert stop not in held[:10] and len(held) > 10


def test_minimum_zero_changes_nothing(tiny_model, tiny_generalist):
    base = _run(tiny_model, tiny_generalist, Params(max_new_tokens=24))
    same = _run(tiny_model, tiny_generalist, Params(max_new_tokens=24, min_new_tokens=0))
    assert base == same


@pytest.mark.parametrize("pipeline", [True, False])
def test_drafts_hold_back_end_of_text_too(tiny_model, tiny_generalist, pipeline):
    # gamma 0 accepts every draft, so an end-of-text the Specialist drafts would stand
    params = Params(gamma=0.0, max_new_tokens=30, pipeline=pipeline)
    free = _run(tiny_model, tiny_generalist, params)
    stop = free[1]
    stopping = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, stop))
    assert len(_run(stopping, tiny_generalist, params)) <= 2
    held = _run(stopping, tiny_generalist, Params(gamma=0.0, max_new_tokens=30,
                                                  min_new_tokens=20, end_release=1.0,
                                                  pipeline=pipeline))
    assert stop not in held[:20] and len(held) >= 20


def test_client_writes_at_the_users_usual_length(tiny_model, tiny_generalist):
    from specsteer.client import Client
    from specsteer.history import HistoryStore

    history = HistoryStore(memory=True)
    body = "Thanks all, the budget for the garden stays flat this quarter, see you Friday. " * 3
    for n in range(4):
        history.add(kind="email", title=f"Budget note {n}", body=body)
    verifier = Verifier(tiny_generalist, tiny_model)

    def client(model) -> Client:
        return Client(model, history=history,
                      companion=lambda: LocalChannel.for_verifier(verifier))

    probe = client(tiny_model).generate("Budget note", max_new_tokens=60, user_length=False)
    stopping = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, probe.tokens[2]))
    request_only = client(stopping).generate("Budget note", max_new_tokens=200, user_length=False)
    assert len(request_only.tokens) <= 2  # stopped at the declared end-of-text
    usual = client(stopping).generate("Budget note", max_new_tokens=200)
    policy = usual.prompt.length
    assert policy is not None and policy.min_new_tokens > 10
    assert policy.min_new_tokens <= len(usual.tokens) <= policy.max_new_tokens


def _repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("method", METHODS)
def test_no_repeat_ngram_keeps_every_method_out_of_loops(tiny_model, tiny_generalist, method):
    free = _run(tiny_model, tiny_generalist,
                Params(method=method, max_new_tokens=60, no_repeat_ngram=0))
    guarded = _run(tiny_model, tiny_generalist,
                   Params(method=method, max_new_tokens=60, no_repeat_ngram=3))
    assert not _repeats(guarded, 3)
    if _repeats(free, 3):  # the rule changed something, so the text differs from the loop
        assert guarded != free


def _thrice(tokens: list[int], n: int) -> bool:
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return any(count > 2 for count in grams.values())


def test_the_tiny_models_do_loop_without_the_rule(tiny_model, tiny_generalist):
    # keeps the test above meaningful: some method repeats a 3-gram when nothing stops it
    assert any(_repeats(_run(tiny_model, tiny_generalist,
                             Params(method=m, max_new_tokens=60, no_repeat_ngram=0)), 3)
               for m in METHODS)


class _CycleSession:
    """A real session whose every logits row also favours the token after the row's own in
    `cycle`: greedy decoding then loops through the cycle, as a small model loops on a
    sentence (the tiny models' own loops are only 2-3 tokens long)."""

    def __init__(self, base, cycle: list[int], bias: float = 50.0) -> None:
        self.base, self.bias = base, bias
        self.after = {token: cycle[(i + 1) % len(cycle)] for i, token in enumerate(cycle)}
        self.first = cycle[0]

    @property
    def length(self) -> int:
        return self.base.length

    def append(self, ids):
        rows = np.array(self.base.append(ids), dtype=np.float32, copy=True)
        for row, token in zip(rows, ids, strict=True):
            row[self.after.get(int(token), self.first)] += self.bias
        return rows

    def rewind(self, length: int) -> None:
        self.base.rewind(length)

    def close(self) -> None:
        self.base.close()


@dataclass
class _Cycling:
    base: object
    cycle: list[int]

    def new_session(self, **options) -> _CycleSession:
        return _CycleSession(self.base.new_session(**options), self.cycle)

    def __getattr__(self, name: str):
        return getattr(self.base, name)


@pytest.mark.parametrize("method", METHODS)
def test_by_default_no_method_repeats_an_8_gram(tiny_model, tiny_generalist, method):
    """The SDK's default stops verbatim loops (docs/BENCHMARKS.md, "Fourth pass"): models that
    loop through a 10-token sentence repeat it with the rule off, never an 8-gram of it with
    the default."""
    cycle = list(range(40, 50))
    specialist, generalist = _Cycling(tiny_model, cycle), _Cycling(tiny_generalist, cycle)
    looping = _run(specialist, generalist, Params(method=method, max_new_tokens=60,
                                                  no_repeat_ngram=0))
    assert _repeats(looping, 8)
    assert not _repeats(_run(specialist, generalist, Params(method=method, max_new_tokens=60)), 8)


@pytest.mark.parametrize("method", METHODS)
def test_the_loop_rule_cuts_the_third_pass_of_a_loop(tiny_model, tiny_generalist, method):
    """`loop_ngram` 4: models that loop through a 10-token sentence write none of its 4-grams
    a third time (each may come back once)."""
    cycle = list(range(40, 50))
    specialist, generalist = _Cycling(tiny_model, cycle), _Cycling(tiny_generalist, cycle)
    looping = _run(specialist, generalist, Params(method=method, max_new_tokens=60,
                                                  no_repeat_ngram=0))
    assert _thrice(looping, 4)
    capped = _run(specialist, generalist, Params(method=method, max_new_tokens=60,
                                                 no_repeat_ngram=0, loop_ngram=4))
    assert not _thrice(capped, 4) and _repeats(capped, 4)  # once more is still allowed
    for bad in (1, -1):
        with pytest.raises(ValueError, match="loop_ngram"):
            Params(loop_ngram=bad)


@pytest.mark.parametrize("method", METHODS)
def test_a_looping_text_ends_at_the_sentence_end_after_its_third_pass(tiny_model,
                                                                      tiny_generalist, method):
    """`loop_end_ngram` 4: models that loop through a 10-token sentence ending in "." stop at
    the "." that closes the third pass (the first 4-gram's third time comes at its start), in
    every method, with nothing banned: the text is the loop's, cut, not respelled."""
    period = tiny_model.tokenizer.encode(".")
    assert len(period) == 1
    cycle = [*range(40, 49), period[0]]
    specialist, generalist = _Cycling(tiny_model, cycle), _Cycling(tiny_generalist, cycle)
    free = Params(method=method, max_new_tokens=60, no_repeat_ngram=0)
    looping = _run(specialist, generalist, free)
    assert len(looping) == 60
    stats = DecodeStats()
    ended = _run(specialist, generalist, replace(free, loop_end_ngram=4), stats)
    start = looping.index(cycle[0])
    assert ended == looping[:start + 30] and ended[-1] == period[0]
    assert stats.loop_ended and stats.tokens == len(ended)
    # without a sentence end the loop is never cut mid-sentence: it runs to the budget
    endless = [*range(40, 50)]
    specialist, generalist = _Cycling(tiny_model, endless), _Cycling(tiny_generalist, endless)
    stats = DecodeStats()
    assert len(_run(specialist, generalist, replace(free, loop_end_ngram=4), stats)) == 60
    assert not stats.loop_ended
    for bad in (1, -1):
        with pytest.raises(ValueError, match="loop_end_ngram"):
            Params(loop_end_ngram=bad)


@pytest.mark.parametrize("pipeline", [True, False])
def test_no_repeat_ngram_holds_in_draft_verify_recover_rounds(tiny_model, tiny_generalist,
                                                              pipeline):
    params = Params(max_new_tokens=200, pipeline=pipeline, no_repeat_ngram=0)
    free = _run(tiny_model, tiny_generalist, params)
    assert _repeats(free, 2)  # the rounds repeat a bigram when nothing stops them
    guarded = _run(tiny_model, tiny_generalist,
                   Params(max_new_tokens=200, pipeline=pipeline, no_repeat_ngram=2))
    assert not _repeats(guarded, 2)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pipeline", [True, False])
def test_no_method_opens_with_a_meta_answer(tiny_model, tiny_generalist, method, pipeline):
    # declare what the method opens with a meta answer: it must open otherwise, and only the
    # phrase's last token is banned (the same first tokens may still open the text)
    free = _run(tiny_model, tiny_generalist, Params(method=method, max_new_tokens=12,
                                                    pipeline=pipeline, meta_openings=()))
    model = WithTokenizer(tiny_model, Writes(tiny_model.tokenizer, "As an AI", free[:3]))
    steered = _run(model, tiny_generalist, Params(
        method=method, max_new_tokens=12, pipeline=pipeline, meta_openings=("As an AI",)))
    assert steered[:2] == free[:2] and steered[2] != free[2]
    assert _run(model, tiny_generalist, Params(method=method, max_new_tokens=12,
                                               pipeline=pipeline, meta_openings=())) == free
