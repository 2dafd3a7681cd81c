"""`Client.stream` returns a `Stream`: pieces as they come, the generation's stats counted into
as it goes (one object, the loop's and the link's counters together), the result at its end."""

from __future__ import annotations

import pytest
from helpers.budget_mail import REQUEST, budget_history

from specsteer.client import Client
from specsteer.generation import GenerationStats
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier


def test_a_stream_counts_as_it_goes_and_ends_with_the_result(tiny_model, tiny_generalist):
    verifier = Verifier(tiny_generalist, tiny_model)
    client = Client(tiny_model, history=budget_history(),
                    companion=lambda: LocalChannel.for_verifier(verifier))
    stream = client.stream(REQUEST, max_new_tokens=12, warm_start=False)
    with pytest.raises(RuntimeError, match="has not ended"):
        stream.result  # noqa: B018 - the property raises until the end
    seen = []
    for piece in stream:
        seen.append((piece.token, stream.stats.tokens, stream.stats.bytes_up))
    result = stream.result
    assert result.stats is stream.stats and isinstance(result.stats, GenerationStats)
    # each piece carries the token that completed its text, in order (a character spelt by
    # several tokens is one piece)
    tokens = iter(result.tokens)
    assert all(any(token == t for t in tokens) for token, _, _ in seen)
    # counted as it went: by each piece the tokens before it were in, and bytes had gone up
    assert all(count >= n + 1 for n, (_, count, _) in enumerate(seen))
    assert seen[0][2] > 0 and result.stats.tokens == len(result.tokens)
    assert result.stats.bytes_up == result.stats.to_json()["bytes_up"] > 0
    again = client.generate(REQUEST, max_new_tokens=12, warm_start=False)
    assert (again.text, again.tokens) == (result.text, result.tokens)
    client.close()


def test_a_stream_closed_early_has_no_result(tiny_model):
    with Client(tiny_model) as client, client.stream("Budget", max_new_tokens=30) as stream:
        next(stream)
    with pytest.raises(RuntimeError, match="closed early has no result"):
        stream.result  # noqa: B018


def test_the_old_out_list_is_named_in_the_error(tiny_model):
    with pytest.raises(TypeError, match="Stream it returns has .result"):
        Client(tiny_model).stream("Budget", result=[])
