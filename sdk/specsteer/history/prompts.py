"""Task prompts of the papers (LaMP, LongLaMP) and ours, with and without the private context.

Owns, per task: which query field it needs, the public request x (context-free user message),
what to search the history with, and how retrieved records render as the private context c, cut
per record to fit a token budget. The context-free request must never contain anything from the
history: it is the only part that may go to the companion. Must not retrieve by itself beyond
`retrieve` (a thin call of `HistoryStore.search`) and must not load models or tokenizers: token
counting is a callable the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING

from specsteer.errors import InvalidQuery, PromptTooLong, UnknownTask
from specsteer.history.records import Hit, Record
from specsteer.history.shared import LAMP7_INSTRUCTION

if TYPE_CHECKING:
    from specsteer.history.store import HistoryStore

DEFAULT_SYSTEM = "You are a writing assistant. Reply with the requested text only."
DEFAULT_MAX_PROMPT_TOKENS = 1024
ELLIPSIS = "…"
_WORD_END = re.compile(r"\S+")


def whitespace_tokens(text: str) -> int:
    """Approximate token count (whitespace-separated words); pass a tokenizer's for exactness."""
    return len(text.split())


@dataclass(frozen=True)
class Task:
    """One writing task: its query fields, request template, search text and record rendering."""

    name: str
    origin: str  # where the task format comes from
    kinds: tuple[str, ...]  # record kinds retrieved as context
    fields: tuple[str, ...]  # query keys; the first is required and is what a plain string fills
    items: str  # "Here are past {items} written by this user"
    request: Callable[[Mapping[str, str]], str]
    search_text: Callable[[Mapping[str, str]], str]
    header: Callable[[Record], str]  # a record's lead-in before its (truncatable) body
    aliases: Mapping[str, str] = field(default_factory=dict)  # other key -> field


@dataclass(frozen=True)
class Prompt:
    """What the device decoding loop consumes; only `request` (and `system`) may leave it."""

    task: str
    request: str  # public request x: the context-free user message
    private_context: str  # rendered records alone (never leaves the device)
    with_context: str  # full user message with the context (Specialist P_Sc)
    system: str  # system message (may be "")
    records: tuple[str, ...]  # ids of the retrieved records used, best first
    truncated: tuple[str, ...]  # ids whose body was cut to fit the budget
    dropped: tuple[str, ...] = ()  # ids left out entirely: not even their header fitted
    tokens: int = 0  # system + with_context, as counted by the count_tokens given
    budget: int = DEFAULT_MAX_PROMPT_TOKENS

    def messages(self, *, private: bool = True) -> list[dict[str, str]]:
        """Chat messages: with the context for the Specialist, without for the companion."""
        chat = [{"role": "system", "content": self.system}] if self.system else []
        return [*chat, {"role": "user", "content": self.with_context if private else self.request}]


def _quoted(value: str) -> str:
    return '"' + value.strip().replace("\n", " ") + '"'


def _labelled(label: str, value: str) -> str:
    return f"{label}: {value}\n" if value else ""


def _rating(record: Record) -> str:
    rating = record.meta.get("rating", record.meta.get("overall", ""))
    return _labelled("Rating", str(rating))


def _strip_reply(subject: str) -> str:
    return re.sub(r"^\s*((re|fwd?|aw)\s*:\s*)+", "", subject, flags=re.IGNORECASE)


def _review_request(q: Mapping[str, str]) -> str:
    text = "Generate the review text written by a reviewer"
    if q.get("rating"):
        text += f" who has given an overall rating of {_quoted(q['rating'])}"
    text += f" for a product with description {_quoted(q['description'])}."
    if q.get("summary"):
        text += f" The summary of the review text is {_quoted(q['summary'])}."
    return text


def _email_request(q: Mapping[str, str]) -> str:
    text = f"Write an email with the subject {_quoted(q['subject'])}"
    if q.get("to"):
        text += f" to {q['to'].strip()}"
    if q.get("newsgroup"):
        text += f" for the newsgroup {q['newsgroup'].strip()}"
    return text + "."


def _tweet_of(value: str) -> str:
    text = value.strip()
    return text[len(LAMP7_INSTRUCTION) :].strip() if text.startswith(LAMP7_INSTRUCTION) else text


_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="abstract",
            origin="LongLaMP-2 (abstract generation)",
            kinds=("paper",),
            fields=("title",),
            items="paper titles and abstracts",
            request=lambda q: f"Generate an abstract for the title {_quoted(q['title'])}.",
            search_text=lambda q: q["title"],
            header=lambda r: f"Title: {r.title}\nAbstract: ",
        ),
        Task(
            name="title",
            origin="LaMP-5 (scholarly title generation)",
            kinds=("paper",),
            fields=("abstract",),
            items="paper titles and abstracts",
            request=lambda q: (
                f"Generate a title for the following abstract of a paper: {q['abstract'].strip()}"
            ),
            search_text=lambda q: q["abstract"],
            header=lambda r: f"Title: {r.title}\nAbstract: ",
        ),
        Task(
            name="review",
            origin="LongLaMP-3 (product review writing)",
            kinds=("review",),
            fields=("description", "rating", "summary"),
            items="product reviews",
            request=_review_request,
            search_text=lambda q: f"{q['description']} {q.get('summary', '')}",
            header=lambda r: _labelled("Product", r.title) + _rating(r) + "Review: ",
            aliases={"product": "description"},
        ),
        Task(
            name="topic",
            origin="LongLaMP-4 (topic / Reddit post writing)",
            kinds=("post",),
            fields=("summary", "subreddit"),
            items="posts",
            request=lambda q: (
                f"Generate the content for a Reddit post with the summary {_quoted(q['summary'])}"
                + (f" in r/{q['subreddit'].strip()}." if q.get("subreddit") else ".")
            ),
            search_text=lambda q: q["summary"],
            header=lambda r: _labelled("Title", r.title) + ("Post: " if r.title else ""),
            aliases={"title": "summary"},
        ),
        Task(
            name="tweet",
            origin="LaMP-7 (tweet paraphrasing)",
            kinds=("tweet",),
            fields=("tweet",),
            items="tweets",
            request=lambda q: f"{LAMP7_INSTRUCTION} {_tweet_of(q['tweet'])}",
            search_text=lambda q: _tweet_of(q["tweet"]),
            header=lambda r: "",
            aliases={"text": "tweet", "input": "tweet"},
        ),
        Task(
            name="email",
            origin="SpecSteer app task (newsgroup posts as email)",
            kinds=("email",),
            fields=("subject", "to", "newsgroup"),
            items="emails",
            request=_email_request,
            search_text=lambda q: _strip_reply(q["subject"]),
            header=lambda r: f"Subject: {r.title}\n",
            aliases={"title": "subject"},
        ),
    )
}


def task_names() -> list[str]:
    """The task names `build_prompt` accepts."""
    return list(_TASKS)


def get_task(name: str) -> Task:
    """The task definition; raises `UnknownTask` naming the valid ones."""
    try:
        return _TASKS[name]
    except KeyError:
        raise UnknownTask(f"unknown task {name!r}; choose one of {task_names()}") from None


def _query_fields(task: Task, query: Mapping[str, object] | str) -> dict[str, str]:
    if isinstance(query, str):
        query = {task.fields[0]: query}
    if not isinstance(query, Mapping):
        raise InvalidQuery(f"a {task.name} query is a string or a dict, not {type(query).__name__}")
    fields: dict[str, str] = {}
    for key, value in query.items():
        name = task.aliases.get(key, key)
        if name in task.fields and value is not None and name not in fields:
            fields[name] = str(value)
    if not fields.get(task.fields[0], "").strip():
        raise InvalidQuery(
            f"the {task.name} task needs a non-empty {task.fields[0]!r} in its query "
            f"(fields: {list(task.fields)})"
        )
    return fields


def query_text(task: str, query: Mapping[str, object] | str) -> str:
    """The text to BM25-search the history with for this query item."""
    spec = get_task(task)
    return spec.search_text(_query_fields(spec, query))


def request_text(task: str, query: Mapping[str, object] | str) -> str:
    """The public, context-free request for this query item."""
    spec = get_task(task)
    return spec.request(_query_fields(spec, query))


def _lcfirst(text: str) -> str:
    return text[:1].lower() + text[1:]


def _truncate(text: str, limit: int, count_tokens: Callable[[str], int]) -> str:
    """The longest word-prefix of `text` that, with an ellipsis, counts at most `limit`."""
    ends = [match.end() for match in _WORD_END.finditer(text)]
    low, high = 0, len(ends) - 1  # words kept; len(ends) itself would not need truncation
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(f"{text[: ends[middle - 1]]} {ELLIPSIS}") <= limit:
            low = middle
        else:
            high = middle - 1
    if low:
        return f"{text[: ends[low - 1]]} {ELLIPSIS}"
    return ELLIPSIS if count_tokens(ELLIPSIS) <= limit else ""


def _fair_shares(needs: Sequence[int], available: int) -> list[int]:
    """Split `available` tokens: short records get all they need, long ones share the rest."""
    shares = [0] * len(needs)
    left = max(available, 0)
    order = sorted(range(len(needs)), key=needs.__getitem__)
    for position, index in enumerate(order):
        shares[index] = min(needs[index], left // (len(needs) - position))
        left -= shares[index]
    return shares


class _Renderer:
    """Renders one task's context for a list of (record, body) and counts the whole prompt."""

    def __init__(
        self, task: Task, request: str, system: str, count_tokens: Callable[[str], int]
    ) -> None:
        self.task, self.request, self.system, self.count = task, request, system, count_tokens

    def context(self, entries: Sequence[tuple[Record, str]]) -> str:
        if not entries:
            return ""
        items = [
            f"[{number}] {self.task.header(record)}{body}".rstrip()
            for number, (record, body) in enumerate(entries, start=1)
        ]
        return "\n\n".join([f"Here are past {self.task.items} written by this user:", *items])

    def message(self, context: str) -> str:
        if not context:
            return self.request
        return f"{context}\n\nFollowing their style, {_lcfirst(self.request)}"

    def tokens(self, entries: Sequence[tuple[Record, str]]) -> int:
        system = self.count(self.system) if self.system else 0
        return system + self.count(self.message(self.context(entries)))


def build_prompt(
    task: str,
    query: Mapping[str, object] | str,
    hits: Sequence[Hit | Record],
    *,
    count_tokens: Callable[[str], int] = whitespace_tokens,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    per_record_tokens: int | None = None,
    system: str = DEFAULT_SYSTEM,
) -> Prompt:
    """The task's prompt with and without the retrieved records, fitted to a token budget.

    Records keep their rank order. Every record's header (title, subject...) is kept when it
    fits; bodies share the remaining budget (short ones whole, long ones cut with an ellipsis,
    listed in `truncated`); when even the headers do not fit, the lowest-ranked records are left
    out and listed in `dropped`.
    `per_record_tokens` caps each body even when the budget would allow more.
    """
    spec = get_task(task)
    renderer = _Renderer(spec, spec.request(_query_fields(spec, query)), system, count_tokens)
    base = renderer.tokens([])
    if base > max_prompt_tokens:
        raise PromptTooLong(
            f"the {task} request alone counts {base} tokens, over max_prompt_tokens="
            f"{max_prompt_tokens}; raise the budget or shorten the query"
        )
    records: list[Record] = []
    for hit in hits:
        record = hit.record if isinstance(hit, Hit) else hit
        if record.id not in {kept.id for kept in records}:
            records.append(record)
    ranked = [record.id for record in records]
    while records and renderer.tokens([(r, "") for r in records]) > max_prompt_tokens:
        records.pop()
    needs = [count_tokens(record.body) for record in records]
    caps = [need if per_record_tokens is None else min(need, per_record_tokens) for need in needs]
    headers_only = renderer.tokens([(r, "") for r in records])
    shares = _fair_shares(caps, max_prompt_tokens - headers_only)

    def body(index: int) -> str:
        record = records[index]
        if shares[index] >= needs[index]:
            return record.body
        return _truncate(record.body, shares[index], count_tokens)

    entries = [(record, body(index)) for index, record in enumerate(records)]
    # Real tokenizers are not additive across joins: shrink the largest body until it fits.
    for _ in range(16):
        over = renderer.tokens(entries) - max_prompt_tokens
        if over <= 0 or not entries:
            break
        largest = max(range(len(entries)), key=shares.__getitem__)
        shares[largest] = max(0, shares[largest] - over)
        entries[largest] = (records[largest], body(largest))
    while entries and renderer.tokens(entries) > max_prompt_tokens:
        entries.pop()
    used = {record.id for record, _ in entries}
    context = renderer.context(entries)
    message = renderer.message(context)
    return Prompt(
        task=task,
        request=renderer.request,
        private_context=context,
        with_context=message,
        system=system,
        records=tuple(record.id for record, _ in entries),
        truncated=tuple(record.id for record, text in entries if text != record.body),
        dropped=tuple(record_id for record_id in ranked if record_id not in used),
        tokens=renderer.tokens(entries),
        budget=max_prompt_tokens,
    )


def retrieve(
    store: HistoryStore,
    task: str,
    query: Mapping[str, object] | str,
    k: int = 5,
    *,
    before: str | date | datetime | None = None,
) -> list[Hit]:
    """Top-k records of the task's kinds for this query item (the Specialist's context)."""
    spec = get_task(task)
    return store.search(query_text(task, query), k, kinds=spec.kinds, before=before)
