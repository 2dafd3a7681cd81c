"""Task prompts: request vs private context, token budgets, query fields, retrieval by kind."""

from __future__ import annotations

import re

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
from specsteer.history.prompts import ELLIPSIS, get_task, prompt_budget

QUERIES = {
    "abstract": {"title": "Sparse Verification for Private Decoding"},
    "title": {"abstract": "We study decoding where a small model drafts and a large one checks."},
    "review": {"description": "A stainless kettle", "rating": "4", "summary": "Fast, loud"},
    "topic": {"summary": "My first marathon", "subreddit": "running"},
    "tweet": {"tweet": "I enjoy Miley, but everyone has their own taste, right?"},
    "email": {"subject": "Re: budget for Q3", "to": "finance team"},
    "note": {"topic": "Groceries for the weekend"},
    "reply": {"message": "Can you send the slides?", "subject": "Slides", "to": "Ana"},
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
    assert task_names() == [
        "abstract", "title", "review", "topic", "tweet", "email", "note", "reply"
    ]
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
    # One earlier turn per record, best-ranked last (nearest the request).
    assert len(prompt.examples) == 3
    shown = [answer for _, answer in prompt.examples]
    if task == "title":
        assert shown == [r.title for r in reversed(records)]
        requests = [request for request, _ in prompt.examples]
        assert all(r.body in q for q, r in zip(requests, reversed(records), strict=True))
    else:
        assert shown == [r.body for r in reversed(records)]
    for record in records:
        assert record.body in prompt.private_context and record.body in prompt.with_context
        assert record.body not in prompt.request  # the public request carries no history
    assert prompt.records == tuple(r.id for r in records)
    assert prompt.truncated == () and prompt.dropped == ()
    private, public = prompt.messages(), prompt.messages(private=False)
    assert [m["role"] for m in private] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert private[-1]["content"] == prompt.private_request
    assert prompt.private_request.startswith(prompt.request)
    assert f"about {prompt.length.median_words} words" in prompt.private_request
    assert public == [private[0], {"role": "user", "content": prompt.request}]
    assert prompt.tokens == sum(whitespace_tokens(m["content"]) + 5 for m in private)


def test_no_hits_means_the_context_free_prompt() -> None:
    prompt = build_prompt("email", "Lunch on Friday", [], system="")
    assert prompt.private_context == "" and prompt.with_context == prompt.request
    assert prompt.request.startswith('Write your message with the subject "Lunch on Friday".')
    assert prompt.messages() == [{"role": "user", "content": prompt.request}]
    assert prompt.examples == () and prompt.length is None


@pytest.mark.parametrize("task", task_names())
def test_public_request_states_the_task_and_asks_for_the_text_only(task: str) -> None:
    request = request_text(task, QUERIES[task])
    if task == "tweet":  # LaMP-7's own instruction: "without any explanation before or after it"
        assert "without any explanation" in request
        return
    assert "only" in request and "Reply with the" in request
    if task in {"abstract", "review", "topic"}:
        assert re.search(r"about \d+ to \d+ words", request)
    if task in {"abstract", "review", "topic", "note"}:
        assert "no title" in request
    if task in {"email", "reply"}:
        assert "no subject line" in request and "square brackets" in request
        assert "[" not in request  # no placeholder to imitate


def test_longlamp_requests_ask_for_the_text_in_first_person() -> None:
    review = request_text("review", QUERIES["review"])
    assert "in the first person" in review and "You rated it 4 out of 5" in review
    assert "write the review itself, do not describe it" in review
    topic = request_text("topic", QUERIES["topic"])
    assert "in the first person" in topic and "r/running" in topic


@settings(max_examples=40, deadline=None)
@given(
    bodies=st.lists(st.text(min_size=1, max_size=200).filter(str.strip), min_size=0, max_size=5),
    titles=st.lists(st.text(max_size=30), min_size=5, max_size=5),
    budget=st.integers(min_value=200, max_value=2000),
    task=st.sampled_from(task_names()),
)
def test_public_prompt_is_a_pure_function_of_task_and_query(
    bodies: list[str], titles: list[str], budget: int, task: str
) -> None:
    records = [
        make_record(kind=get_task(task).kinds[0], id=f"r{i}", title=titles[i], body=body,
                    meta={"rating": i, "summary": f"s{i}", "newsgroup": f"g{i}"})
        for i, body in enumerate(bodies)
    ]
    with_history = build_prompt(task, QUERIES[task], records, max_prompt_tokens=budget)
    without = build_prompt(task, QUERIES[task], [], max_prompt_tokens=budget)
    assert with_history.request == without.request == request_text(task, QUERIES[task])
    assert with_history.messages(private=False) == without.messages(private=False)


def test_private_length_comes_from_the_history() -> None:
    short = [make_record(kind="paper", id=f"s{i}", title=f"T{i}", body="w " * 40) for i in range(3)]
    long = [make_record(kind="paper", id=f"l{i}", title=f"T{i}", body="w " * 200) for i in range(3)]
    a = build_prompt("abstract", "A title", short, max_prompt_tokens=4000)
    b = build_prompt("abstract", "A title", long, max_prompt_tokens=4000)
    assert a.request == b.request
    assert "about 40 words" in a.private_request and "about 200 words" in b.private_request
    assert (a.length.min_new_tokens, a.length.max_new_tokens) == (24, 60)
    assert (b.length.min_new_tokens, b.length.max_new_tokens) == (120, 300)


def test_a_paraphrase_keeps_the_originals_length_not_the_users() -> None:
    # LaMP-7's gold tweets follow the input's length (r 0.67) more than the user's (r 0.36)
    tweets = [make_record(kind="tweet", id=f"t{i}", body="word " * 30) for i in range(3)]
    original = "one two three four five six seven eight nine ten"
    prompt = build_prompt("tweet", original, tweets)
    assert prompt.length is not None and prompt.length.median_words == 10
    assert (prompt.length.min_new_tokens, prompt.length.max_new_tokens) == (6, 15)
    assert "the original's length (about 10 words)" in prompt.private_request
    assert "about 30 words" not in prompt.private_request
    assert prompt.request == request_text("tweet", original)  # the public side is unchanged
    assert build_prompt("tweet", original, []).length is None  # no examples: no length line


def test_budget_truncates_long_bodies_and_keeps_short_ones() -> None:
    short = make_record(kind="email", id="short", title="Hi", body="see you soon")
    long_a = make_record(kind="email", id="a", title="A", body=" ".join(["alpha"] * 400))
    long_b = make_record(kind="email", id="b", title="B", body=" ".join(["beta"] * 400))
    prompt = build_prompt("email", "Status", [long_a, short, long_b], max_prompt_tokens=500)
    assert prompt.tokens <= 500
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
    prompt = build_prompt("abstract", "A title", records, max_prompt_tokens=200)
    assert prompt.tokens <= 200
    assert prompt.records == ("p0",)
    assert prompt.dropped == ("p1", "p2", "p3", "p4")


def test_request_over_budget_raises() -> None:
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=5"):
        build_prompt("title", QUERIES["title"], [], max_prompt_tokens=5)


def test_non_additive_token_counter_still_fits() -> None:
    def chars(text: str) -> int:  # ~4 characters a token, like many BPE vocabularies
        return (len(text) + 3) // 4

    records = _records("paper", count=4, words=300)
    prompt = build_prompt("abstract", "Title", records, count_tokens=chars, max_prompt_tokens=700,
                          min_example_tokens=0)
    assert chars(prompt.system) + chars(prompt.with_context) <= 700
    assert prompt.tokens <= 700 and set(prompt.truncated) == {r.id for r in records}


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.text(min_size=1, max_size=400), min_size=0, max_size=6),
    budget=st.integers(min_value=80, max_value=600),
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
    assert request_text("review", QUERIES["review"]).count('"') == 4  # product and summary
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


def test_mail_examples_show_the_users_own_words_only() -> None:
    quoted = make_record(kind="email", id="m1", title="Re: launch", meta={"newsgroup": "sci.space"},
                         body="In article <1@x> bob writes:\n> the launch slipped\n\n"
                              "It slipped because the budget did.\n--\nAna  ana@example.org")
    only_quotes = make_record(kind="email", id="m2", title="Re: x", body="bob wrote:\n> hi")
    prompt = build_prompt("email", {"subject": "Re: launch", "newsgroup": "sci.space"},
                          [quoted, only_quotes])
    assert [answer for _, answer in prompt.examples] == ["It slipped because the budget did."]
    assert prompt.records == ("m1",) and prompt.dropped == ("m2",) and prompt.truncated == ()
    assert quoted.body.startswith("In article")  # the record itself is untouched
    assert prompt.length is not None and prompt.length.median_words == 6


def test_newsgroup_request_asks_for_a_post_not_a_letter() -> None:
    post = request_text("email", {"subject": "Re: Pluto mission?", "newsgroup": "sci.space"})
    assert "follow-up post in the thread \"Pluto mission?\" that you sent to the newsgroup " \
        "sci.space" in post and "view" not in post
    assert "no greeting" in post and "no quoted lines" in post and "no sign-off" in post
    fresh = request_text("email", {"subject": "Pluto mission", "newsgroup": "sci.space"})
    assert "post with the subject \"Pluto mission\"" in fresh
    assert "Write your message" in request_text("email", {"subject": "Budget", "to": "Ana"})


def test_tight_budget_keeps_fewer_longer_examples() -> None:
    records = _records("paper", count=5, words=200)
    few = build_prompt("abstract", "Title", records, max_prompt_tokens=400,
                       min_example_tokens=96)
    many = build_prompt("abstract", "Title", records, max_prompt_tokens=400,
                        min_example_tokens=0)
    assert len(many.records) == 5 and len(few.records) < 5
    assert few.records == many.records[: len(few.records)]  # the best-ranked ones stay
    assert few.dropped == many.records[len(few.records):]
    assert all(len(answer.split()) >= 95 for _, answer in few.examples)
    assert few.tokens <= 400
    # a roomy budget keeps all of them whole
    roomy = build_prompt("abstract", "Title", records, max_prompt_tokens=4000)
    assert len(roomy.records) == 5 and roomy.truncated == ()


def test_cut_at_a_sentence_end_reads_whole_else_an_ellipsis_marks_it() -> None:
    sentences = " ".join(f"Sentence number {i} ends here." for i in range(40))
    record = make_record(kind="paper", id="p", title="T", body=sentences)
    prompt = build_prompt("abstract", "T", [record], max_prompt_tokens=200, min_example_tokens=0)
    answer = prompt.examples[0][1]
    assert prompt.truncated == ("p",) and answer.endswith("ends here.")
    assert ELLIPSIS not in answer and sentences.startswith(answer)
    run_on = make_record(kind="paper", id="r", title="T", body="word " * 400)
    cut = build_prompt("abstract", "T", [run_on], max_prompt_tokens=200).examples[0][1]
    assert cut.endswith(ELLIPSIS)
    # a sentence end early in what fits does not throw most of it away
    early = make_record(kind="paper", id="e", title="T", body="Short one. " + "word " * 400)
    assert build_prompt("abstract", "T", [early], max_prompt_tokens=200).examples[0][1] \
        .endswith(ELLIPSIS)


@pytest.mark.parametrize("task", task_names())
def test_without_a_budget_each_task_fills_its_own(task: str) -> None:
    """No budget given: the task's measured one (`Task.max_prompt_tokens`), filled by a history
    larger than any task's budget; a budget given wins over it."""
    spec = get_task(task)
    records = _records(spec.kinds[0], count=5, words=600)
    prompt = build_prompt(task, QUERIES[task], records)
    assert prompt.budget == spec.max_prompt_tokens == prompt_budget(task)
    assert spec.max_prompt_tokens - 100 < prompt.tokens <= spec.max_prompt_tokens
    given = build_prompt(task, QUERIES[task], records, max_prompt_tokens=3000)
    assert given.budget == 3000 == prompt_budget(task, 3000)
    assert spec.max_prompt_tokens < given.tokens <= 3000


def test_measured_tasks_have_their_own_budgets() -> None:
    """The budgets chosen from measurement (docs/BENCHMARKS.md, "The private prompt budget")
    differ by task; every task's fits a whole request with room for examples."""
    budgets = {task: get_task(task).max_prompt_tokens for task in task_names()}
    assert len({budgets["abstract"], budgets["tweet"], budgets["email"]}) > 1
    for task, budget in budgets.items():
        assert build_prompt(task, QUERIES[task], []).tokens < budget // 2, task
