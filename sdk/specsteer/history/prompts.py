"""Task prompts of the papers (LaMP, LongLaMP) and ours, with and without the private context.

Owns, per task: which query field it needs, the public request x (context-free user message that
states the task, the expected length and that only the text itself is wanted), what to search
the history with, and how retrieved records become the private context c: earlier chat turns of
the same task, each the request that record would answer and, as the assistant's reply, the
user's own text, cut per record to fit a token budget. The public request is a pure function of
the task and the query: nothing from the history may enter it, since it is the only part that
may go to the companion. The user's typical length (`length.LengthPolicy`) is measured on the
retrieved records and stays on the device. Must not retrieve by itself beyond `retrieve` (a thin
call of `HistoryStore.search`) and must not load models or tokenizers: token counting is a
callable the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING

from specsteer.errors import InvalidQuery, PromptTooLong, UnknownTask
from specsteer.history.clean import own_words
from specsteer.history.length import LengthPolicy, length_policy
from specsteer.history.records import Hit, Record
from specsteer.history.shared import LAMP7_INSTRUCTION
from specsteer.tokenizer import check_text

if TYPE_CHECKING:
    from specsteer.history.store import HistoryStore

DEFAULT_SYSTEM = (
    "You are a writing assistant who writes as the user. Reply with the requested text itself "
    "and nothing else."
)
# The private prompt budget of a task whose own was not measured (`Task.max_prompt_tokens`).
DEFAULT_MAX_PROMPT_TOKENS = 1024
# A cut example shorter than this shows the user's opening, not their voice: when the budget
# would cut examples below it, fewer (lower-ranked ones left out) and longer examples are kept.
DEFAULT_MIN_EXAMPLE_TOKENS = 96
# Chat markup around each message (ChatML: "<|im_start|>", role, newline, "<|im_end|>", newline).
MESSAGE_OVERHEAD_TOKENS = 5
ELLIPSIS = "…"
_WORD_END = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)")
# A cut at a sentence end is kept when it keeps at least this share of what would fit: the
# example then reads as a whole text (a model copies a trailing ellipsis as the way to stop).
SENTENCE_CUT_SHARE = 0.5
_ONLY = "no title, no heading, no placeholders in brackets, no comments before or after it"


def whitespace_tokens(text: str) -> int:
    """Approximate token count (whitespace-separated words); pass a tokenizer's for exactness."""
    return len(text.split())


@dataclass(frozen=True)
class Task:
    """One writing task: query fields, public request, search text and examples from records."""

    name: str
    origin: str  # where the task format comes from
    kinds: tuple[str, ...]  # record kinds retrieved as context
    fields: tuple[str, ...]  # query keys; the first is required and is what a plain string fills
    items: str  # what the user's texts are called: "abstracts", "emails"...
    request: Callable[[Mapping[str, str]], str]  # the public request (states task and length)
    search_text: Callable[[Mapping[str, str]], str]
    # (record, its body as it fits) -> (the request it answers, the user's answer): one earlier
    # turn of the task. The body is the record's truncatable part, in the request or the answer.
    example: Callable[[Record, str], tuple[str, str]]
    answer: Callable[[Record], str] = lambda record: record.body  # whole text, for its length
    # What of a text is the user's own writing (mail: no quotes, attributions, signature).
    own_text: Callable[[str], str] = lambda text: text
    aliases: Mapping[str, str] = field(default_factory=dict)  # other key -> field
    # A rewrite (paraphrase): the query text whose length the output keeps. None: the user's
    # own texts set the length. (LaMP-7: gold tweets follow the input's length far more closely
    # than the user's typical one; docs/BENCHMARKS.md.)
    rewrites: Callable[[Mapping[str, str]], str] | None = None
    # The private prompt budget when the caller gives none (`prompt_budget`): its prefill is
    # most of a cold first token's wait on a CPU, so each task gets the smallest budget whose
    # quality and acceptance were measured no worse than a larger one (docs/BENCHMARKS.md).
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS


@dataclass(frozen=True)
class Prompt:
    """What the device decoding loop consumes; only `request`, `system` and `prefix` (the
    user's draft being continued) may leave it."""

    task: str
    request: str  # public request x: the context-free user message
    private_context: str  # the earlier turns as text (never leaves the device)
    with_context: str  # the private conversation flattened to text (display, logs, tests)
    system: str  # system message (may be "")
    records: tuple[str, ...]  # ids of the retrieved records used, best first
    truncated: tuple[str, ...]  # ids whose body was cut to fit the budget
    dropped: tuple[str, ...] = ()  # ids left out entirely: not even their request fitted
    tokens: int = 0  # the private messages as counted by the count_tokens given, markup included
    budget: int = DEFAULT_MAX_PROMPT_TOKENS
    examples: tuple[tuple[str, str], ...] = ()  # (request, user's text) turns, best one last
    private_request: str = ""  # the private view's last user message ("" = `request`)
    length: LengthPolicy | None = None  # the user's typical length (device only)
    # The user's draft the output continues (`continuation_prefix` of it): it ends both views,
    # after the assistant's turn opens, so it leaves the device with `request`.
    prefix: str = ""

    def messages(self, *, private: bool = True) -> list[dict[str, str]]:
        """Chat messages: with the earlier turns for the Specialist, without for the companion."""
        chat = [{"role": "system", "content": self.system}] if self.system else []
        if not private:
            return [*chat, {"role": "user", "content": self.request}]
        for request, answer in self.examples:
            chat += [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]
        return [*chat, {"role": "user", "content": self.private_request or self.request}]


def _quoted(value: str) -> str:
    return '"' + value.strip().replace("\n", " ") + '"'


def _strip_reply(subject: str) -> str:
    return re.sub(r"^\s*((re|fwd?|aw)\s*:\s*)+", "", subject, flags=re.IGNORECASE)


def _meta(record: Record, *keys: str) -> str:
    for key in keys:
        value = record.meta.get(key)
        if value not in (None, ""):
            return str(value)
    return ""


def _abstract_request(q: Mapping[str, str]) -> str:
    return (
        f"Write the abstract of your paper titled {_quoted(q['title'])}. Reply with the abstract "
        f"only, one paragraph of about 100 to 200 words: {_ONLY}."
    )


def _title_request(q: Mapping[str, str]) -> str:
    return (
        f"Generate a title for the following abstract of a paper: {q['abstract'].strip()}\n"
        "Reply with the title only, on one line."
    )


def _review_request(q: Mapping[str, str]) -> str:
    text = (
        f"Write your customer review of the product {_quoted(q['description'])}, in the first "
        "person, as the customer who bought it."
    )
    if q.get("rating"):
        text += f" You rated it {q['rating'].strip()} out of 5."
    if q.get("summary"):
        text += f" In short, your verdict was {_quoted(q['summary'])}."
    return text + (
        " Reply with the review text only, about 100 to 200 words: write the review itself, "
        f"do not describe it or repeat the product description; {_ONLY}."
    )


def _topic_request(q: Mapping[str, str]) -> str:
    where = f" in r/{q['subreddit'].strip()}" if q.get("subreddit") else ""
    return (
        f"Write your Reddit post{where} about {_quoted(q['summary'])}, in the first person, as "
        f"its author. Reply with the post text only, about 100 to 300 words: {_ONLY}."
    )


def _tweet_of(value: str) -> str:
    text = value.strip()
    return text[len(LAMP7_INSTRUCTION) :].strip() if text.startswith(LAMP7_INSTRUCTION) else text


def _email_request(q: Mapping[str, str]) -> str:
    subject = _quoted(q["subject"])
    if q.get("newsgroup"):  # a post to a group, read by many: not a letter to one person
        thread = _strip_reply(q["subject"]) != q["subject"]
        what = f"follow-up post in the thread {_quoted(_strip_reply(q['subject']))}" if thread \
            else f"post with the subject {subject}"
        # "the post you sent": an artifact of the user's to reproduce, not an opinion asked of
        # the assistant (asked for "your own view", the models answered "As an AI ...").
        return (
            f"Write the {what} that you sent to the newsgroup {q['newsgroup'].strip()}, in the "
            "first person, as its author. Reply with the text of the post only, usually one to "
            "four paragraphs: no subject line, no greeting such as \"Dear ...\", no quoted "
            "lines, no sign-off, no placeholders in square brackets, no comments before or "
            "after it."
        )
    text = f"Write your message with the subject {subject}"
    if q.get("to"):
        text += f" to {q['to'].strip()}"
    return text + (
        ". Reply with the body of the message only, usually one to four short paragraphs: no "
        "subject line, no greeting or signature placeholders in square brackets, no "
        "comments before or after it."
    )


def _note_request(q: Mapping[str, str]) -> str:
    return f"Write your note about {_quoted(q['topic'])}. Reply with the note only: {_ONLY}."


def _reply_request(q: Mapping[str, str]) -> str:
    text = "Write your reply"
    if q.get("to"):
        text += f" to {q['to'].strip()}"
    if q.get("subject"):
        text += f" (subject {_quoted(q['subject'])})"
    return text + (
        f" to this message: {_quoted(q['message'])}. Reply with the body of your reply only, "
        "usually one or two short paragraphs: no subject line, no placeholders in square "
        "brackets, no comments before or after it."
    )


def _email_example(record: Record, body: str) -> tuple[str, str]:
    fields = {"subject": record.title or "(no subject)"}
    if newsgroup := _meta(record, "newsgroup"):
        fields["newsgroup"] = newsgroup
    return _email_request(fields), body


def _review_example(record: Record, body: str) -> tuple[str, str]:
    fields = {"description": record.title or "(unnamed product)"}
    fields["rating"] = _meta(record, "rating", "overall")
    fields["summary"] = _meta(record, "summary")
    return _review_request(fields), body


def _topic_example(record: Record, body: str) -> tuple[str, str]:
    fields = {"summary": record.title or "your day", "subreddit": _meta(record, "subreddit")}
    return _topic_request(fields), body


_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="abstract",
            origin="LongLaMP-2 (abstract generation)",
            kinds=("paper",),
            fields=("title",),
            items="abstracts",
            request=_abstract_request,
            search_text=lambda q: q["title"],
            example=lambda r, body: (_abstract_request({"title": r.title or "(untitled)"}), body),
            max_prompt_tokens=512,  # docs/BENCHMARKS.md, the private prompt budget
        ),
        Task(
            name="title",
            origin="LaMP-5 (scholarly title generation)",
            kinds=("paper",),
            fields=("abstract",),
            items="titles",
            request=_title_request,
            search_text=lambda q: q["abstract"],
            example=lambda r, body: (_title_request({"abstract": body}), r.title),
            answer=lambda record: record.title,
        ),
        Task(
            name="review",
            origin="LongLaMP-3 (product review writing)",
            kinds=("review",),
            fields=("description", "rating", "summary"),
            items="reviews",
            request=_review_request,
            search_text=lambda q: f"{q['description']} {q.get('summary', '')}",
            example=_review_example,
            aliases={"product": "description"},
        ),
        Task(
            name="topic",
            origin="LongLaMP-4 (topic / Reddit post writing)",
            kinds=("post",),
            fields=("summary", "subreddit"),
            items="posts",
            request=_topic_request,
            search_text=lambda q: q["summary"],
            example=_topic_example,
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
            # The tweet an earlier one paraphrased is not kept: ask for a tweet of one's own.
            example=lambda r, body: ("Write one of your tweets.", body),
            aliases={"text": "tweet", "input": "tweet"},
            rewrites=lambda q: _tweet_of(q["tweet"]),
            max_prompt_tokens=256,  # docs/BENCHMARKS.md, the private prompt budget
        ),
        Task(
            name="email",
            origin="SpecSteer app task (newsgroup posts as email)",
            kinds=("email",),
            fields=("subject", "to", "newsgroup"),
            items="messages",
            request=_email_request,
            search_text=lambda q: _strip_reply(q["subject"]),
            example=_email_example,
            own_text=own_words,
            aliases={"title": "subject"},
            max_prompt_tokens=768,  # docs/BENCHMARKS.md, the private prompt budget
        ),
        Task(
            name="note",
            origin="SpecSteer app task (personal notes)",
            kinds=("note",),
            fields=("topic",),
            items="notes",
            request=_note_request,
            search_text=lambda q: q["topic"],
            example=lambda r, body: (_note_request({"topic": r.title or "(untitled)"}), body),
            aliases={"title": "topic", "subject": "topic"},
        ),
        Task(
            name="reply",
            origin="SpecSteer app task (email reply)",
            kinds=("email",),
            fields=("message", "subject", "to"),
            items="messages",
            request=_reply_request,
            search_text=lambda q: f"{_strip_reply(q.get('subject', ''))} {q['message']}",
            example=_email_example,  # the user's own messages: their voice when writing back
            own_text=own_words,
            aliases={"text": "message", "body": "message"},
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


def prompt_budget(task: str, max_prompt_tokens: int | None = None) -> int:
    """The private prompt budget: the caller's when given, else the task's measured default."""
    return get_task(task).max_prompt_tokens if max_prompt_tokens is None else max_prompt_tokens


def _query_fields(task: Task, query: Mapping[str, object] | str) -> dict[str, str]:
    if isinstance(query, str):
        query = {task.fields[0]: query}
    if not isinstance(query, Mapping):
        raise InvalidQuery(f"the {task.name} task's query must be a string or a dict, not "
                           f"{type(query).__name__} ({query!r})")
    fields: dict[str, str] = {}
    for key, value in query.items():
        name = task.aliases.get(key, key)
        if name in task.fields and value is not None and name not in fields:
            fields[name] = check_text(str(value), f"query[{key!r}]")
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
    """The public, context-free request for this query item: a function of task and query only."""
    spec = get_task(task)
    return spec.request(_query_fields(spec, query))


def continuation_prefix(draft: str) -> str:
    """The text a continuation starts from: the draft without trailing spaces or tabs (a word's
    leading space belongs to the word's token, so the output supplies it); newlines are kept."""
    return draft.rstrip(" \t")


def private_request_text(request: str, items: str, length: LengthPolicy | None,
                         *, rewrite: bool = False) -> str:
    """The private view's last user message: the request, then the length to write at (the
    user's typical length, or for a rewrite the original's)."""
    if length is None:
        return request
    whose = "the original's length" if rewrite else "their usual length"
    return (
        f"{request} Write it in the same voice as your earlier {items}, at about {whose} "
        f"(about {length.median_words} words)."
    )


def _truncate(text: str, limit: int, count_tokens: Callable[[str], int]) -> str:
    """`text` cut to count at most `limit`: at the last sentence end that fits when that keeps
    at least half of what fits (no mark), else the longest word-prefix with an ellipsis."""
    fitted = _word_prefix(text, limit, count_tokens, ellipsis=False)
    ends = [match.end() for match in _SENTENCE_END.finditer(fitted)]
    if ends and ends[-1] >= SENTENCE_CUT_SHARE * len(fitted) \
            and count_tokens(text[: ends[-1]]) <= limit:
        return text[: ends[-1]]
    return _word_prefix(text, limit, count_tokens, ellipsis=True)


def _word_prefix(text: str, limit: int, count_tokens: Callable[[str], int], *,
                 ellipsis: bool) -> str:
    """The longest word-prefix of `text` that (with an ellipsis if asked) counts <= `limit`."""
    mark = f" {ELLIPSIS}" if ellipsis else ""
    ends = [match.end() for match in _WORD_END.finditer(text)]
    low, high = 0, len(ends) - 1  # words kept; len(ends) itself would not need truncation
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(f"{text[: ends[middle - 1]]}{mark}") <= limit:
            low = middle
        else:
            high = middle - 1
    if low:
        return f"{text[: ends[low - 1]]}{mark}"
    if not ellipsis:
        return ""
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
    """Renders one task's earlier turns for a list of (record, body) and counts the messages."""

    def __init__(
        self, task: Task, request: str, final: str, system: str, count_tokens: Callable[[str], int]
    ) -> None:
        self.task, self.request, self.final = task, request, final
        self.system, self.count = system, count_tokens

    def examples(self, entries: Sequence[tuple[Record, str]]) -> list[tuple[str, str]]:
        # Best-ranked record last: the example nearest the request weighs most.
        return [self.task.example(record, body) for record, body in reversed(entries)]

    def last(self, entries: Sequence[tuple[Record, str]]) -> str:
        """The last user message: with the user's length when there are earlier turns."""
        return self.final if entries else self.request

    def tokens(self, entries: Sequence[tuple[Record, str]]) -> int:
        texts = [self.system] if self.system else []
        for request, answer in self.examples(entries):
            texts += [request, answer]
        texts.append(self.last(entries))
        return sum(self.count(text) + MESSAGE_OVERHEAD_TOKENS for text in texts)


def _transcript(examples: Sequence[tuple[str, str]]) -> str:
    return "\n\n".join(f"User: {request}\nAssistant: {answer}" for request, answer in examples)


def build_prompt(
    task: str,
    query: Mapping[str, object] | str,
    hits: Sequence[Hit | Record],
    *,
    count_tokens: Callable[[str], int] = whitespace_tokens,
    max_prompt_tokens: int | None = None,
    per_record_tokens: int | None = None,
    min_example_tokens: int = DEFAULT_MIN_EXAMPLE_TOKENS,
    system: str = DEFAULT_SYSTEM,
) -> Prompt:
    """The task's prompt with and without the retrieved records, fitted to a token budget.

    Each record becomes an earlier turn of the task (its request, then the user's text as the
    reply), best-ranked last. `max_prompt_tokens` None: the task's budget (`prompt_budget`).
    Records keep their rank order in `records`. Every turn's request is
    kept when it fits; bodies share the remaining budget (short ones whole, long ones cut with
    an ellipsis, listed in `truncated`); when even the requests do not fit, the lowest-ranked
    records are left out and listed in `dropped`. `per_record_tokens` caps each body even when
    the budget would allow more. When cutting would leave an example body shorter than
    `min_example_tokens` (or its whole text, if shorter), the lowest-ranked records are left out
    (`dropped`) until the rest get that much: fewer, longer examples. Only the user's own words of
    a record are shown (the task's `own_text`: for mail, without quotes, attributions and
    signature; the stored record is untouched); a record with none is left out. `length` is
    measured on the retrieved records' own texts, whole.
    """
    spec = get_task(task)
    max_prompt_tokens = prompt_budget(task, max_prompt_tokens)
    if min_example_tokens < 0:
        raise ValueError(f"min_example_tokens must be >= 0, not {min_example_tokens}")
    fields = _query_fields(spec, query)
    request = spec.request(fields)
    records, own, ranked = _own_words(spec, hits)
    length = length_policy(
        [spec.rewrites(fields)] if spec.rewrites is not None
        else [spec.own_text(spec.answer(record)) for record in records], count_tokens
    )
    final = private_request_text(request, spec.items, length, rewrite=spec.rewrites is not None)
    renderer = _Renderer(spec, request, final, system, count_tokens)
    public = renderer.tokens([])
    if public > max_prompt_tokens:
        raise PromptTooLong(
            f"the {task} request alone counts {public} tokens, over max_prompt_tokens="
            f"{max_prompt_tokens}; raise the budget or shorten the query"
        )
    entries = _fitted(records, own, renderer, max_prompt_tokens, per_record_tokens,
                      min_example_tokens)
    used = {record.id for record, _ in entries}
    examples = tuple(renderer.examples(entries))
    private_request = renderer.last(entries)
    context = _transcript(examples)
    return Prompt(
        task=task,
        request=request,
        private_context=context,
        with_context=f"{context}\n\nUser: {private_request}" if context else request,
        system=system,
        records=tuple(record.id for record, _ in entries),
        truncated=tuple(record.id for record, text in entries if text != own[record.id]),
        dropped=tuple(record_id for record_id in ranked if record_id not in used),
        tokens=renderer.tokens(entries),
        budget=max_prompt_tokens,
        examples=examples,
        private_request=private_request,
        length=length if entries else None,
    )


def _own_words(spec: Task, hits: Sequence[Hit | Record]
               ) -> tuple[list[Record], dict[str, str], list[str]]:
    """The records in rank order that hold some of the user's own words, those words by record
    id, and every record id in rank order (duplicates dropped)."""
    records: list[Record] = []
    own: dict[str, str] = {}  # record id -> the user's own words of its body
    ranked: list[str] = []
    for hit in hits:
        record = hit.record if isinstance(hit, Hit) else hit
        if record.id in own or record.id in ranked:
            continue
        ranked.append(record.id)
        text = spec.own_text(record.body)
        if text.strip():
            records.append(record)
            own[record.id] = text
    return records, own, ranked


def _fitted(records: list[Record], own: Mapping[str, str], renderer: _Renderer,
            max_prompt_tokens: int, per_record_tokens: int | None,
            min_example_tokens: int) -> list[tuple[Record, str]]:
    """(record, body shown) of the records that fit the budget (`build_prompt` says how)."""
    count_tokens = renderer.count
    while records and renderer.tokens([(r, "") for r in records]) > max_prompt_tokens:
        records.pop()
    while True:
        needs = [count_tokens(own[record.id]) for record in records]
        caps = [need if per_record_tokens is None else min(need, per_record_tokens)
                for need in needs]
        room = max_prompt_tokens - renderer.tokens([(r, "") for r in records])
        shares = _fair_shares(caps, room)
        floor = [min(cap, min_example_tokens) for cap in caps]
        if len(records) <= 1 or all(map(int.__ge__, shares, floor)):
            break
        records.pop()  # too many examples for the budget: the lowest-ranked one goes

    def body(index: int) -> str:
        text = own[records[index].id]
        if shares[index] >= needs[index]:
            return text
        return _truncate(text, shares[index], count_tokens)

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
    return entries


def retrieve(
    store: HistoryStore,
    task: str,
    query: Mapping[str, object] | str,
    k: int = 5,
    *,
    before: str | date | datetime | None = None,
    exclude: Collection[str] = (),
) -> list[Hit]:
    """Top-k records of the task's kinds for this query item (the Specialist's context).

    `exclude`: record ids left out — the record being continued, whose text is the prefix
    already (retrieved as an example too, the model would copy it and stop where it ends)."""
    spec = get_task(task)
    hits = store.search(query_text(task, query), k + len(exclude), kinds=spec.kinds,
                        before=before)
    return [hit for hit in hits if hit.record.id not in exclude][:k]
