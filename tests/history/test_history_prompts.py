"""Task prompts: request vs private context, token budgets, query fields, retrieval by kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsteer.errors import InvalidQuery, PromptTooLong, UnknownTask
from specsteer.history import (
    HistoryStore,
    Hit,
    build_prompt,
    make_record,
    query_text,
    request_text,
    retrieve,
    task_names,
    whitespace_tokens,
)
from specsteer.history.prompts import ELLIPSIS, get_task

QUERIES = {
    "abstract": {"title": "Sparse Verification for Private Decoding"},
    "title": {"abstract": "We study decoding where a small model drafts and a large one checks."},
    "review": {"description": "A stainless kettle", "rating": "4", "summary": "Fast, loud"},
    "topic": {"summary": "My first marathon", "subreddit": "running"},
    "tweet": {"tweet": "I enjoy Miley, but everyone has their own taste, right?"},
    "email": {"subject": "Re: budget for Q3", "to": "finance team"},
}


def _records(kind: str, count: int = 3, words: int = 20) -> list:
    return [
        make_record(
            kind=kind,
            id=f"{kind}{i}",
            title=f"Past item {i}",
            body=" ".join(f"w{i}x{j}" for j in range(words)),
            meta={"rating": 5},
        )
        for i in range(count)
    ]


def test_task_names() -> None:
    assert task_names() == ["abstract", "title", "review", "topic", "tweet", "email"]
    with pytest.raises(UnknownTask, match="choose one of"):
        get_task("poem")


@pytest.mark.parametrize("task", task_names())
def test_prompt_with_and_without_context(task: str) -> None:
    kind = get_task(task).kinds[0]
    records = _records(kind)
    hits = [Hit(record, 1.0 / (i + 1)) for i, record in enumerate(records)]
    prompt = build_prompt(task, QUERIES[task], hits)
    assert prompt.task == task
    assert prompt.request == request_text(task, QUERIES[task])
    main_value = QUERIES[task][get_task(task).fields[0]]
    assert main_value.strip() in prompt.request
    assert prompt.private_context.startswith("Here are past ")
    assert "written by this user:" in prompt.private_context
    assert prompt.with_context.startswith(prompt.private_context)
    assert "\n\nFollowing their style, " in prompt.with_context
    assert prompt.with_context.endswith(prompt.request[1:])  # same request, lower-cased start
    for record in records:
        assert record.body in prompt.private_context
        assert record.body not in prompt.request  # the public request carries no history
    assert prompt.records == tuple(r.id for r in records)
    assert prompt.truncated == () and prompt.dropped == ()
    assert prompt.tokens == whitespace_tokens(prompt.system) + whitespace_tokens(
        prompt.with_context
    )
    private, public = prompt.messages(), prompt.messages(private=False)
    assert private[-1]["content"] == prompt.with_context
    assert public[-1]["content"] == prompt.request and public[0] == private[0]


def test_no_hits_means_the_context_free_prompt() -> None:
    prompt = build_prompt("email", "Lunch on Friday", [], system="")
    assert prompt.private_context == "" and prompt.with_context == prompt.request
    assert prompt.request == 'Write an email with the subject "Lunch on Friday".'
    assert prompt.messages() == [{"role": "user", "content": prompt.request}]


def test_budget_truncates_long_bodies_and_keeps_short_ones() -> None:
    short = make_record(kind="email", id="short", title="Hi", body="see you soon")
    long_a = make_record(kind="email", id="a", title="A", body=" ".join(["alpha"] * 400))
    long_b = make_record(kind="email", id="b", title="B", body=" ".join(["beta"] * 400))
    prompt = build_prompt("email", "Status", [long_a, short, long_b], max_prompt_tokens=200)
    assert prompt.tokens <= 200
    assert prompt.records == ("a", "short", "b")  # rank order kept
    assert prompt.truncated == ("a", "b")
    assert "see you soon" in prompt.private_context
    assert prompt.private_context.count(ELLIPSIS) == 2
    # The two long records share what is left fairly.
    alphas, betas = prompt.with_context.count("alpha"), prompt.with_context.count("beta")
    assert alphas > 50 and abs(alphas - betas) <= 1


def test_per_record_cap() -> None:
    record = make_record(kind="tweet", id="t", body=" ".join(["word"] * 100))
    prompt = build_prompt("tweet", "hello", [record], per_record_tokens=10)
    assert prompt.truncated == ("t",)
    assert prompt.private_context.count("word") == 9  # nine words and the ellipsis
    whole = build_prompt("tweet", "hello", [record], per_record_tokens=100)
    assert whole.truncated == ()


def test_records_that_cannot_fit_are_dropped_worst_first() -> None:
    records = [
        make_record(kind="paper", id=f"p{i}", title=" ".join(["title"] * 30), body="b")
        for i in range(5)
    ]
    prompt = build_prompt("abstract", "A title", records, max_prompt_tokens=90)
    assert prompt.tokens <= 90
    assert prompt.records == ("p0",)
    assert prompt.dropped == ("p1", "p2", "p3", "p4")


def test_request_over_budget_raises() -> None:
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=5"):
        build_prompt("title", QUERIES["title"], [], max_prompt_tokens=5)


def test_non_additive_token_counter_still_fits() -> None:
    def chars(text: str) -> int:  # ~4 characters a token, like many BPE vocabularies
        return (len(text) + 3) // 4

    records = _records("paper", count=4, words=300)
    prompt = build_prompt("abstract", "Title", records, count_tokens=chars, max_prompt_tokens=700)
    assert chars(prompt.system) + chars(prompt.with_context) <= 700
    assert prompt.tokens <= 700 and set(prompt.truncated) == {r.id for r in records}


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.text(min_size=1, max_size=400), min_size=0, max_size=6),
    budget=st.integers(min_value=40, max_value=400),
    cap=st.one_of(st.none(), st.integers(min_value=0, max_value=50)),
)
def test_prompt_always_fits_its_budget(bodies: list[str], budget: int, cap: int | None) -> None:
    records = [
        make_record(kind="note", id=f"n{i}", title=f"t{i}", body=body)
        for i, body in enumerate(bodies)
    ]
    prompt = build_prompt(
        "topic", "A post", records, max_prompt_tokens=budget, per_record_tokens=cap
    )
    assert prompt.tokens <= budget
    assert set(prompt.truncated) <= set(prompt.records)
    assert set(prompt.records) | set(prompt.dropped) == {r.id for r in records}
    assert not set(prompt.records) & set(prompt.dropped)


def test_query_fields_and_aliases() -> None:
    assert query_text("email", {"subject": "Re: RE: fwd: Budget"}) == "Budget"
    assert query_text("abstract", "Just a title") == "Just a title"
    assert query_text("review", QUERIES["review"]) == "A stainless kettle Fast, loud"
    lamp = "Paraphrase the following tweet without any explanation before or after it: hi all"
    assert query_text("tweet", {"input": lamp}) == "hi all"
    assert request_text("tweet", {"input": lamp}) == lamp  # instruction not doubled
    assert "r/running" in request_text("topic", QUERIES["topic"])
    assert request_text("review", QUERIES["review"]).count('"') == 6
    with pytest.raises(InvalidQuery, match="'title'"):
        request_text("abstract", {"abstract": "no title here"})
    with pytest.raises(InvalidQuery):
        query_text("email", {"subject": "   "})


def test_retrieve_uses_the_task_kinds(store: HistoryStore) -> None:
    store.add(kind="email", id="mail", title="Budget", body="budget numbers for the quarter")
    store.add(kind="paper", id="paper", title="Budget", body="budget constrained decoding")
    store.add(kind="email", id="old", title="Budget", body="old budget", created_at="2001")
    assert {h.record.id for h in retrieve(store, "email", {"subject": "budget"})} == {"mail", "old"}
    assert [h.record.id for h in retrieve(store, "abstract", "budget decoding")] == ["paper"]
    dated = retrieve(store, "email", "budget", before="2010")
    assert [h.record.id for h in dated] == ["old"]
