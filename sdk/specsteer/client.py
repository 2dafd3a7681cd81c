"""`Client`: the SDK's front door — history retrieval, prompts, local Specialist, companion.

`stream()` returns a `Stream` of text pieces with their provenance as they are decided, whose
stats count as it goes; `generate()` returns the whole text with stats. The private context is
retrieved and rendered here and handed to the on-device Specialist only; the companion receives
the context-free request's token ids. The Client owns every thread it starts (`Workers`):
`close()`, or leaving a `with` block, waits for them.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specsteer.device import (
    DevicePrompt,
    ModeChange,
    OfflinePolicy,
    Params,
    TokenEvent,
    decode,
)
from specsteer.device.rounds import MadeAhead, first_draft_key, make_ahead, s0_ahead_wanted
from specsteer.device.rules import make_rules
from specsteer.errors import (
    CompanionConfigError,
    CompanionUnavailable,
    ConfigError,
    GenerationCancelled,
)
from specsteer.generation import GenerationStats, Piece, Result, Stream
from specsteer.history import HistoryStore, Prompt, build_prompt, continuation_prefix, retrieve
from specsteer.link import CompanionLink, FrameChannel, FrameTap, LinkStats
from specsteer.prepared import KeptSessions, KeptTracks, OpeningSession
from specsteer.runtime import load_device_model
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer.tokenizer import Message, Tokenizer, check_text
from specsteer.workers import Workers

ChannelFactory = Callable[[], FrameChannel]
log = logging.getLogger("specsteer.client")


class _NoToken:
    """The `token=` default: no token at all (a companion started with `--open`), unlike an
    explicit None or '', which are mistakes (an unset environment variable)."""

    def __repr__(self) -> str:
        return "NO_TOKEN"


NO_TOKEN = _NoToken()


@dataclass(frozen=True)
class Prepared:
    """A request `Client.prepare` retrieved for and is prefilling in the background (and,
    with a companion, whose session it is opening over the public prompt)."""

    prompt: Prompt = field(repr=False)
    device_prompt: DevicePrompt = field(repr=False)
    worker: threading.Thread = field(repr=False)
    session: OpeningSession | None = field(default=None, repr=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the prefill and the session opening are done (or `timeout`); True
        when they are."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        self.worker.join(timeout)
        if self.session is not None:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            self.session.done(left)
        return not self.worker.is_alive() and (self.session is None or self.session.done(0))


class Client:
    """Personalized generation on the device, steered by a companion when one is reachable.

    specialist: a loaded model, a registry name or a compiled folder (the same artifact the
        companion hosts as its generic Specialist).
    history: a HistoryStore or the path of its SQLite file (None: no private context).
    companion: a ws:// / wss:// URL, a list of them (companions serving the same models: each
        new connection starts at the URL after the one the last connection used and skips those
        that cannot be reached, so generations spread over the list and a dropped link resumes
        on another companion first), a factory of FrameChannels (in-process companions), or None
        for local-only generation. Anything else (`127.0.0.1:8765`, `http://...`) is a
        `ConfigError` here, not local-only text later.
    token: the device token (`specsteer-companion tokens create NAME`). Omit it only for a
        companion started with `--open`; None, '' or a non-string is a `ConfigError` (what
        `os.environ.get("SPECSTEER_TOKEN")` gives when the variable is unset). A token the
        companion refuses raises `CompanionAuthError` at the first generation, whatever
        `offline` says.
    offline: the default offline policy of this Client's generations ("degrade", "fail" or
        "wait(SECONDS)"; `stream(offline=...)` overrides it). It covers what may come back by
        itself (unreachable, timed out, dropped); a refusal no retry fixes (`CompanionRefused`:
        token, models, protocol version, certificate) is raised at once in every mode.
    allow_insecure: send `token` over plain ws:// to a host other than this machine. Refused by
        default (`CompanionConfigError`): anyone on the path could read the token and the
        prompt. Use wss:// instead; this is for trusted private networks only, and logs a
        warning.
    threads: ONNX Runtime threads of a Specialist loaded here (None: every core this process
        may use).
    max_prompt_tokens: the private prompt's token budget for every task (None: each task's
        own measured budget, `prompts.prompt_budget`).
    """

    def __init__(
        self,
        specialist: LanguageModel | str | Path,
        *,
        history: HistoryStore | str | Path | None = None,
        companion: str | Sequence[str] | ChannelFactory | None = None,
        token: str | _NoToken = NO_TOKEN,
        generalist_sha256: str = "",
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        retrieve_k: int = 5,
        max_prompt_tokens: int | None = None,
        tap: FrameTap | None = None,
        threads: int | None = None,
        allow_insecure: bool = False,
        offline: str | OfflinePolicy = "degrade",
    ) -> None:
        companion = _companion_urls(companion)
        token = _checked_token(token) if companion is not None else ""
        if isinstance(companion, tuple) and token:
            for url in companion:
                _check_token_transport(url, allow_insecure)
        _check_positive(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
        if not isinstance(retrieve_k, int) or retrieve_k < 0:
            raise ConfigError(f"retrieve_k must be an int >= 0, not {retrieve_k!r}")
        if max_prompt_tokens is not None and (not isinstance(max_prompt_tokens, int)
                                              or max_prompt_tokens < 1):
            raise ConfigError(f"max_prompt_tokens must be None or an int >= 1, not "
                              f"{max_prompt_tokens!r}")
        self.offline = OfflinePolicy.parse(offline)
        self.specialist = specialist if not isinstance(specialist, str | Path) \
            else load_device_model(specialist, threads=threads)
        self.history = HistoryStore(history) if isinstance(history, str | Path) else history
        self.companion: tuple[str, ...] | ChannelFactory | None = companion
        self._next_url = 0  # where the next connection starts in a list of URLs
        self.token = token
        self.generalist_sha256 = generalist_sha256
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retrieve_k = retrieve_k
        self.max_prompt_tokens = max_prompt_tokens
        self.tap = tap
        self._workers = Workers()  # every thread this Client starts; `close` joins them
        self._kept = KeptTracks(self.specialist, self._workers)
        self._sessions = KeptSessions(self._workers)

    # -- prompts ---------------------------------------------------------------------------
    def render(self, query: Mapping[str, Any] | str, *, task: str = "email",
               before: str | None = None, prefix: str = "",
               exclude: Collection[str] = ()) -> tuple[Prompt, DevicePrompt]:
        """Retrieve the private context and render both views of the request.

        prefix: the user's draft to continue (see `stream`): it ends both views.
        exclude: record ids not to retrieve (the record being continued).
        """
        check_text(prefix, "prefix")
        if isinstance(before, str):
            check_text(before, "before")
        for record_id in exclude:
            check_text(record_id, "exclude")
        hits = retrieve(self.history, task, query, self.retrieve_k, before=before,
                        exclude=exclude) if self.history is not None and self.retrieve_k > 0 else []
        tok = self.specialist.tokenizer
        prompt = build_prompt(task, query, hits, count_tokens=tok.count,
                              max_prompt_tokens=self.max_prompt_tokens)
        private_ids, public_ids = (
            tok.chat_ids([Message(m["role"], m["content"]) for m in prompt.messages(private=p)])
            for p in (True, False))
        if prefix := continuation_prefix(prefix):
            # the assistant's turn is open and the draft follows it, in both views: the
            # companion must read the text it helps continue (the history stays private)
            prompt = replace(prompt, prefix=prefix)
            prefix_ids = tok.encode(prefix)
            private_ids, public_ids = [*private_ids, *prefix_ids], [*public_ids, *prefix_ids]
        return prompt, DevicePrompt(private_ids=private_ids, public_ids=public_ids)

    def prepare(self, query: Mapping[str, Any] | str, *, task: str = "email",
                before: str | None = None, prefix: str = "",
                exclude: Collection[str] = (), preset: str | None = None,
                settings: Params | None = None, user_length: bool = True,
                open_session: bool = True, **params: Any) -> Prepared:
        """Retrieve and prefill a request ahead of time (while the user is still typing).

        Returns at once; the Specialist prefills the private prompt on a background thread
        and the Client keeps that state (one per task). A following `generate`/`stream` for
        `task` reuses every prompt token it shares with it from the start (the task's
        instructions, the records still retrieved, the request's unchanged words) and runs
        only the rest; if the prefill is still running, the generation takes over from the
        chunk it reached. Calling it again as the request changes is cheap: the shared
        prefix is kept.

        With a companion and a collaborative method (`preset`/`settings`/`params`/
        `user_length` as for `stream`), the companion session over the public prompt is opened
        too, so the first round needs no hello and no companion prefill; and (greedy drafting
        methods) the first round's draft is made after the prefill, and with P_S0 on the
        device (the default) its track over the public prompt too. A generation whose public
        prompt or settings differ replaces that session on the same connection; one whose
        private prompt or draft settings differ drafts again.

        open_session=False: nothing leaves the device until the generation is asked for (an
        app preparing while the user types text they have not yet asked help with: the public
        request, which may hold their draft, goes up only with the generation).
        """
        prompt, device_prompt = self.render(query, task=task, before=before, prefix=prefix,
                                            exclude=exclude)
        options = self._fit_user(_settings(preset, settings, params), prompt, user_length)
        key = first_draft_key(options) if self.companion is not None else None
        rules = make_rules(options, self.specialist.tokenizer)
        public = list(device_prompt.public_ids) if s0_ahead_wanted(options) else None
        then = None if key is None else (
            lambda track, stop: make_ahead(self.specialist, track, options, rules, stop,
                                           drafts=True, public_ids=public))
        worker = self._kept.prepare(task, device_prompt.private_ids, then, key)
        session = None
        if open_session and self.companion is not None and options.collaborative:
            session = self._sessions.prepare(
                task, lambda stop: self._connect(cancel=stop),  # type: ignore[arg-type,return-value]
                device_prompt.public_ids, options)
        return Prepared(prompt, device_prompt, worker, session)

    def close(self) -> None:
        """Free the kept prefill states (their KV caches), close prepared sessions and wait for
        every thread this Client started (each ends within its own bound: a link closing, a
        connection attempt within `connect_timeout_s`)."""
        self._kept.close()
        self._sessions.close()
        self._workers.join()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fit_user(self, settings: Params, prompt: Prompt, user_length: bool) -> Params:
        """`settings` for this user, decided on the device: the assistant openings and phrases
        their texts never use are banned (`Params.for_user`); with `user_length`, their usual
        length for the task within the request's budget (a draft being continued holds part of
        it)."""
        settings = settings.for_user([*(text for _, text in prompt.examples), prompt.prefix])
        if not user_length or prompt.length is None:
            return settings
        low, high = prompt.length.clamp(settings.max_new_tokens)
        if prompt.prefix:
            low = max(0, low - self.specialist.tokenizer.count(prompt.prefix))
        return replace(settings, min_new_tokens=max(settings.min_new_tokens, low),
                       max_new_tokens=high)

    # -- companion -------------------------------------------------------------------------
    def _connect(self, stats: LinkStats | None = None,
                 cancel: threading.Event | None = None) -> CompanionLink | None:
        if self.companion is None:
            return None
        if not isinstance(self.companion, tuple):
            return self._handshake(self.companion(), stats, cancel)
        from specsteer.transport import WebSocketChannel

        urls, failures = self.companion, []
        for step in range(len(urls)):
            at = (self._next_url + step) % len(urls)
            try:
                channel = WebSocketChannel(urls[at], ssl_context=self.ssl_context,
                                           open_timeout=self.connect_timeout_s)
                link = self._handshake(channel, stats, cancel)
            except CompanionUnavailable as exc:  # unreachable: try the next one
                failures.append(str(exc))
                continue
            self._next_url = (at + 1) % len(urls)
            return link
        raise CompanionUnavailable("; ".join(failures))

    def _handshake(self, channel: FrameChannel, stats: LinkStats | None,
                   cancel: threading.Event | None = None) -> CompanionLink:
        link = CompanionLink(channel, timeout=self.timeout_s, tap=self.tap, stats=stats,
                             cancel=cancel)
        try:
            link.hello(generalist_sha256=self.generalist_sha256,
                       specialist_sha256=self.specialist.sha256, auth_token=self.token)
        except BaseException:  # refused or timed out: nobody else holds the link to close it
            link.close()
            raise
        return link

    # -- generation ------------------------------------------------------------------------
    def stream(self, query: Mapping[str, Any] | str, *, task: str = "email",
               preset: str | None = None, stop: Sequence[str] = (),
               offline: str | OfflinePolicy | None = None,
               before: str | None = None,
               on_mode: Callable[[ModeChange], None] | None = None,
               settings: Params | None = None, user_length: bool = True,
               cancel: threading.Event | None = None, prefix: str = "",
               exclude: Collection[str] = (),
               **params: Any) -> Stream:
        """A `Stream` of text pieces as tokens are decided; its `stats` count as it goes and
        its `result` is the whole generation once it has ended.

        settings: a whole `Params`; or `preset` plus `params`, which are `Params` fields.
        user_length: write at the user's usual length for this task — no end-of-text before
        `min_new_tokens` and at most `max_new_tokens` from the history's length policy, capped by
        the request's `max_new_tokens` (decided on the device; never sent). False: only the
        request's budget.

        offline: "degrade" (go on with the local Specialist when the companion is unreachable or
        drops, reconnecting with backoff), "fail" (raise CompanionUnavailable) or
        "wait(SECONDS)"; None: the Client's `offline`. A `CompanionRefused` (wrong token, other
        models or protocol version, a certificate that does not verify) is raised in every
        mode. `on_mode` is told of every switch between collaborative and local.

        cancel: set it (from any thread) to stop the generation: at the next drafted token or
        prefill pass (~0.1 s each), or within 50 ms of a wait for the companion (a verdict is
        not waited for); the stream ends, the companion session is closed (off the caller's
        time) and `stats.cancelled` is set.

        prefix: the user's draft so far, to be continued: both prompts end with it (the
        assistant's turn already begun) and the pieces are what comes after it — after
        `continuation_prefix(prefix)`, the draft without trailing spaces or tabs. It is part of
        the public request: the user asks for help with this text, and a Generalist that did not
        read it steers the output back to a fresh start (measured: docs/apps.md). The history
        stays private as always. The user's length counts it: the minimum of new tokens is
        lowered by its length. `exclude`: record ids not to retrieve (the draft's own record, if
        it is stored: its text is already the prefix).
        """
        if "result" in params:  # the out-list of an earlier release
            raise TypeError("stream() takes no result= list any more: the Stream it returns has "
                            ".result once it has ended (and .stats as it goes)")
        policy = self.offline if offline is None else OfflinePolicy.parse(offline)
        settings = _settings(preset, settings, params)
        started = time.perf_counter()
        prompt, device_prompt = self.render(query, task=task, before=before, prefix=prefix,
                                            exclude=exclude)
        settings = self._fit_user(settings, prompt, user_length)
        stats = GenerationStats(method=settings.method, records=prompt.records,
                                truncated=prompt.truncated,
                                retrieval_s=time.perf_counter() - started,
                                prompt_tokens=len(device_prompt.private_ids
                                                  if settings.method != "slm"
                                                  else device_prompt.public_ids))
        job = _Job(task, prompt, device_prompt, settings, stats, started, policy, on_mode,
                   cancel, tuple(stop))
        return Stream(self._write(job), stats)

    def generate(self, query: Mapping[str, Any] | str, **options: Any) -> Result:
        """The whole generation at once (see `stream` for the options)."""
        return self.stream(query, **options).finish()

    def _write(self, job: _Job) -> Generator[Piece, None, Result]:
        """The pieces of one generation (`stream`), then its result."""
        link = self._prepared_link(job)
        local, ahead = self._local_track(job)
        events = decode(self.specialist, job.device_prompt, job.settings, link, job.stats,
                        connect=self._connector(job), offline=job.policy,
                        on_mode=job.on_mode, cancel=job.cancel, local=local, ahead=ahead,
                        workers=self._workers)
        tokens: list[int] = []
        provenance: list[str] = []
        text = ""
        try:
            for piece, event in _pieces(events, self.specialist.tokenizer, tokens, provenance):
                text += piece
                cut = _find_stop(text, job.stop)
                if cut is not None:
                    text = text[:cut]
                    break
                yield Piece(piece, event.token, event.provenance, event.round)
        finally:
            events.close()
            if local is not None:
                self._kept.give_back(job.task, local, job.device_prompt.private_ids)
        job.stats.total_s = time.perf_counter() - job.started
        return Result(text=text if job.stop else self.specialist.tokenizer.decode(tokens),
                      tokens=tokens, provenance=provenance, stats=job.stats, prompt=job.prompt)

    def _prepared_link(self, job: _Job) -> CompanionLink | None:
        """The session `prepare` is opening for the task, first (a prefill it started goes on
        meanwhile); its hello and OpenSession count as this generation's."""
        link = None
        with contextlib.suppress(GenerationCancelled):  # decode then ends at once, cancelled
            link = self._sessions.take(job.task, job.cancel)
        if link is not None and not job.settings.collaborative:
            self._workers.start(link.close, "specsteer-close")  # not on the caller's time
            return None
        if link is not None:
            job.stats.add_bytes(link.stats)
            link.stats = job.stats
        return link

    def _local_track(self, job: _Job) -> tuple[Track | None, MadeAhead | None]:
        """The task's kept Specialist track for the private prompt (prefilled as far as an
        earlier prepare or generation got) and the first draft (with P_S0's public track)
        made ahead, if it fits; the SLM
        baseline reads the public prompt only and keeps none."""
        if job.settings.method == "slm":
            return None, None
        ids = job.device_prompt.private_ids
        room = len(ids) + job.settings.max_new_tokens + 64
        key = first_draft_key(job.settings) if self.companion is not None else None
        local, job.stats.prefill_reused, ahead = self._kept.take(job.task, ids, room, key)
        job.stats.prefill_tokens = local.pending
        return local, ahead

    def _connector(self, job: _Job) -> Callable[[], CompanionLink] | None:
        """New links for this generation, counting into its stats (None: no companion)."""
        if self.companion is None:
            return None

        def connect() -> CompanionLink:
            link = self._connect(job.stats, job.cancel)
            if link is None:
                raise CompanionUnavailable("no companion configured")
            return link

        return connect


@dataclass(frozen=True)
class _Job:
    """One `stream` call, rendered and fitted: what its generator needs."""

    task: str
    prompt: Prompt
    device_prompt: DevicePrompt
    settings: Params
    stats: GenerationStats
    started: float
    policy: OfflinePolicy
    on_mode: Callable[[ModeChange], None] | None
    cancel: threading.Event | None
    stop: tuple[str, ...]


def _pieces(events: Iterator[TokenEvent], tok: Tokenizer, tokens: list[int],
            provenance: list[str]) -> Iterator[tuple[str, TokenEvent]]:
    """New text and the token that completed it; unfinished characters wait for the rest.
    Each token is appended to `tokens` and `provenance` as it comes."""
    detokenizer, last = tok.stream_decoder(), None
    for event in events:
        if event.token in tok.eos_ids:
            break
        tokens.append(event.token)
        provenance.append(event.provenance)
        last, piece = event, detokenizer.push(event.token)
        if not detokenizer.pending:
            yield piece, event
    # Held text the end made final (byte-fallback runs); a character the end cut off stays
    # out of the pieces, as it always has.
    tail = detokenizer.flush()
    if tail and not tail.endswith("\ufffd") and last is not None:
        yield tail, last


_LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}



def _companion_urls(companion: Any) -> tuple[str, ...] | ChannelFactory | None:
    """`companion=` as a tuple of checked ws:// / wss:// URLs, a channel factory or None."""
    if companion is None or (callable(companion) and not isinstance(companion, str)):
        return companion  # type: ignore[no-any-return]
    if isinstance(companion, str):
        _check_url("companion", companion)
        return (companion,)
    if not isinstance(companion, Sequence) or not companion:
        raise CompanionConfigError(
            f"companion must be a ws:// or wss:// URL, a non-empty list of them, a channel "
            f"factory or None, not {companion!r}")
    for at, url in enumerate(companion):
        _check_url(f"companion[{at}]", url)
    return tuple(companion)


def _check_url(name: str, url: object) -> None:
    """A companion URL: ws:// or wss://, a host, a port that is a number."""
    if not isinstance(url, str):
        raise CompanionConfigError(f"{name} must be a ws:// or wss:// URL (a str), not {url!r}")
    if not url.strip():
        raise CompanionConfigError(f"{name}={url!r} is empty; give a ws:// or wss:// URL, or "
                                   "companion=None for local-only generation")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("ws", "wss") or not parts.hostname:
        secure = parts.scheme.lower() == "https"
        rest = url.split("://", 1)[1] if "://" in url else url
        raise CompanionConfigError(f"{name}={url!r} is not a ws:// or wss:// URL; did you mean "
                                   f"{('wss://' if secure else 'ws://') + rest!r}?")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise CompanionConfigError(
            f"{name}={url!r}: the port is not a number from 0 to 65535") from None


def _checked_token(token: object) -> str:
    """The device token to send ('' when omitted); None, '' or a non-string is a mistake."""
    if isinstance(token, _NoToken):
        return ""
    if token is None:
        raise CompanionConfigError(
            "token=None: the device token is missing (os.environ.get gives None for an unset "
            "variable); pass the token, or omit token= for a companion started with --open")
    if not isinstance(token, str):
        raise CompanionConfigError(f"token must be a str, not {type(token).__name__} (length "
                                   f"{len(token) if hasattr(token, '__len__') else '?'})")
    if not token.strip():
        raise CompanionConfigError(
            f"token={token!r} is empty; pass the device token, or omit token= for a companion "
            "started with --open")
    return token


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{name} must be a number of seconds > 0, not {value!r}")


def _check_token_transport(url: str, allow_insecure: bool) -> None:
    """Refuse to send a token in the clear (ws://) to another machine unless allowed."""
    parsed = urlsplit(url)
    host = (parsed.hostname or "").lower()
    if parsed.scheme != "ws" or host in _LOOPBACK_HOSTS or host.startswith("127."):
        return
    if not allow_insecure:
        raise CompanionConfigError(
            f"refusing to send the device token over unencrypted ws:// to {host}: anyone on "
            "the network path could read it; use a wss:// URL (TLS), or pass "
            "allow_insecure=True (command line: --allow-insecure) on a trusted private network"
        )
    log.warning("sending the device token over unencrypted ws:// to %s (allow_insecure=True)",
                host)


def _settings(preset: str | None, settings: Params | None, params: Mapping[str, Any]) -> Params:
    """A whole `Params`, or a preset with `Params` fields on top (not both)."""
    if settings is None:
        return Params.preset(preset, **params)
    if preset is not None or params:
        raise ValueError("give either settings or preset/params, not both")
    return settings


def _find_stop(text: str, stop: Sequence[str]) -> int | None:
    positions = [text.find(s) for s in stop if s and s in text]
    return min(positions) if positions else None


__all__ = ["NO_TOKEN", "Client", "GenerationStats", "Piece", "Prepared", "Result", "Stream",
           "TokenEvent"]
