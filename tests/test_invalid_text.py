"""Text that is not text: a lone surrogate ("\\ud800", which a JSON escape can carry) in any
text an app passes is a ValueError naming the field, never an internal error or a bare
TypeError from the tokenizer library (issue 28). The bridge's and the HTTP endpoint's answers
are in tests/bridge/test_bridge_invalid_text.py."""

from __future__ import annotations

import pytest

from specsteer.client import Client
from specsteer.errors import InvalidRecord
from specsteer.history import HistoryStore
from specsteer.settings import Params
from specsteer.tokenizer import check_text

BAD = "Budget \ud800 review"


@pytest.fixture()
def client(tiny_model) -> Client:
    history = HistoryStore(memory=True)
    history.add(kind="email", title="Budget", body="Dear team, the budget stays as it is.")
    return Client(tiny_model, history=history)


def _run(client: Client, call: str, **kwargs) -> None:
    if call == "stream":
        list(client.stream(**kwargs, max_new_tokens=2))
    elif call == "prepare":
        client.prepare(**kwargs)
    else:
        client.generate(**kwargs, max_new_tokens=2)


@pytest.mark.parametrize("call", ["generate", "stream", "prepare"])
@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(query=BAD), "query['subject']"),
    (dict(query={"subject": "ok", "to": BAD}, task="reply"), "query['to']"),
    (dict(query={"message": "ok", "subject": BAD}, task="reply"), "query['subject']"),
    (dict(query="ok", prefix=BAD), "prefix"),
    (dict(query="ok", before="2024\udfff"), "before"),
    (dict(query="ok", exclude=["email:\ud800"]), "exclude"),
])
def test_a_lone_surrogate_is_a_value_error_naming_the_field(client, call, kwargs, field):
    with pytest.raises(ValueError, match="is not valid Unicode text") as info:
        _run(client, call, **kwargs)
    assert type(info.value) is ValueError and str(info.value).startswith(field)


@pytest.mark.parametrize("field", ["title", "body", "source", "id"])
def test_a_record_with_a_lone_surrogate_is_refused_naming_the_field(field):
    record = {"kind": "email", "title": "t", "body": "b", field: BAD}
    with pytest.raises(InvalidRecord, match=f"^{field} is not valid Unicode text"):
        HistoryStore(memory=True).add(**record)
    with pytest.raises(InvalidRecord, match="meta must be JSON-serialisable text"):
        HistoryStore(memory=True).add(kind="email", body="b", meta={"from": BAD})


def test_phrase_options_and_the_tokenizer_refuse_it_too(tiny_model):
    with pytest.raises(ValueError, match="^banned_phrases is not valid Unicode text: a lone "
                                         "surrogate U\\+D800 at character 7"):
        Params(banned_phrases=(BAD,))
    with pytest.raises(ValueError, match="^text is not valid Unicode text"):
        tiny_model.tokenizer.encode(BAD)
    assert check_text("Budget ✓ review", "x") == "Budget ✓ review"  # any real text passes
    with pytest.raises(ValueError, match="x must be a string, got int"):
        check_text(3, "x")
