"""The evaluation loop: every method on every example through the real decoding loop and protocol.

Per example it builds a fresh in-memory `HistoryStore` from the user's profile, retrieves the
BM25 top-k records, renders the prompt with and without them in the Specialist's chat format,
and runs each selected method with `device.decode`. Collaborative methods talk to a companion
that computes beside the device, as on another machine: in this process on its own thread
(`ConcurrentChannel`), or a `specsteer-companion serve` child process (`companion_process`).
The frames are the network's, so bytes, round trips and the overlap of device and companion
work are those a deployment would have; an optional emulated round-trip time delays every
request and reply by half of it each.
Every method decodes under the same length bounds: the user's length policy (from the retrieved
history, as the device applies it) capped by `max_new_tokens`, so no method is cut shorter or
allowed longer than another. Rows carry ROUGE, the length ratio and the style similarity
(`voice`). Rows go to `results.jsonl` one by one, so an interrupted run resumes where it stopped.
It must not change what any method outputs: it calls `decode` and measures (the LLM baseline's
unused device session gets the public prompt, which changes no token).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from specsteer.device import LOCAL_METHODS, METHODS, DecodeStats, DevicePrompt, Params, decode
from specsteer.history import prompts
from specsteer.history.length import LengthPolicy
from specsteer.history.store import HistoryStore
from specsteer.link import CompanionLink, FrameChannel
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.folder import ModelFolder
from specsteer.settings import PRESETS
from specsteer.tokenizer import Message
from specsteer.transport import WebSocketChannel
from specsteer_companion.local import ConcurrentChannel
from specsteer_companion.process import start_companion
from specsteer_companion.verifier import Verifier
from specsteer_lab.eval.data import EvalError, Example
from specsteer_lab.eval.metrics import rouge
from specsteer_lab.eval.voice import Voices
from specsteer_lab.network import DelayProxy

DEFAULT_METHODS = ("slm", "slm_rag", "llm", "speculative", "light_costeer", "costeer",
                   "specsteer@1.0", "specsteer@0.5", "specsteer@0.1")
RESULTS = "results.jsonl"
RUN_CONFIG = "run.json"


class Companion(StrEnum):
    """Where the evaluated companion runs (`companion_process`, `ConcurrentChannel`)."""

    process = "process"
    thread = "thread"


@dataclass(frozen=True)
class MethodSpec:
    """A selectable method: `label` names the results rows ("specsteer@0.5")."""

    label: str
    method: str
    gamma: float
    top_k: int | None = None  # a preset's candidate count; None: the run's --top-k

    @property
    def collaborative(self) -> bool:
        return self.method not in LOCAL_METHODS


def parse_method(name: str) -> MethodSpec:
    """"specsteer@0.1" -> SpecSteer at gamma 0.1; a bare name uses the default gamma (0.5);
    "specsteer:fast" -> SpecSteer with a preset's gamma and candidate count (`Params.preset`)."""
    if ":" in name:
        return _preset(name.strip())
    method, _, gamma_text = name.strip().partition("@")
    if method not in METHODS:
        raise EvalError(f"unknown method {name!r}; choose from {', '.join(METHODS)} "
                        "(SpecSteer with a threshold: specsteer@1.0, specsteer@0.5, specsteer@0.1)")
    if not gamma_text:
        if method == "specsteer":
            return _specsteer(Params().gamma)
        return MethodSpec(method, method, Params().gamma)
    if method != "specsteer":
        raise EvalError(f"{name!r}: only specsteer takes a gamma (specsteer@0.5)")
    try:
        gamma = float(gamma_text)
    except ValueError:
        raise EvalError(f"{name!r}: gamma must be a number, e.g. specsteer@0.5") from None
    if gamma < 0:
        raise EvalError(f"{name!r}: gamma must be >= 0")
    return _specsteer(gamma)


def _preset(name: str) -> MethodSpec:
    method, _, preset = name.partition(":")
    if method != "specsteer" or preset not in PRESETS:
        raise EvalError(f"{name!r}: a preset goes with specsteer, one of "
                        f"{', '.join(f'specsteer:{p}' for p in PRESETS)}")
    params = Params.preset(preset)
    return MethodSpec(name, "specsteer", params.gamma, params.top_k)


def _specsteer(gamma: float) -> MethodSpec:
    # One label per threshold: "specsteer", "specsteer@0.5" and "specsteer@0.50" are one method.
    shown = f"{gamma:.1f}" if round(gamma, 1) == gamma else f"{gamma:g}"
    return MethodSpec(f"specsteer@{shown}", "specsteer", gamma)


def parse_methods(names: Iterable[str]) -> list[MethodSpec]:
    """Methods in the order given, duplicates (same label) dropped."""
    specs: dict[str, MethodSpec] = {}
    for name in names:
        for part in name.replace(",", " ").split():
            spec = parse_method(part)
            specs.setdefault(spec.label, spec)
    if not specs:
        raise EvalError("select at least one method")
    return list(specs.values())


# The decoding settings every method of a run shares, where a run departs from the SDK's:
# at most 64 new tokens; no warm start (each method's own text: no timing-dependent start).
# Pipelining stays on, as on a device: the companion computes apart from the device (its own
# process or thread), so drafting the next round while it verifies pays as it does over a
# network (the output is the same).
EVAL_DECODING = Params(max_new_tokens=64, warm_start=False)
# what each method (gamma, the method itself) and each user (the minimum) set for themselves
PER_METHOD = ("method", "gamma", "min_new_tokens")


@dataclass(frozen=True)
class EvalConfig:
    """What a run holds fixed; a results folder is only resumed under the same config."""

    task: str
    retrieve_k: int = 5
    rtt_ms: float = 0.0
    max_prompt_tokens: int | None = None  # None: the task's own budget (`prompts.prompt_budget`)
    min_example_tokens: int = prompts.DEFAULT_MIN_EXAMPLE_TOKENS
    # Every method gets the user's length policy (min/max new tokens from the history) under
    # decoding.max_new_tokens; off: no minimum and max_new_tokens for all.
    user_length: bool = True
    # the decoding settings of every method (`Params`: the same rules, budget and candidates);
    # each method sets its own method and gamma, each user's length the minimum
    decoding: Params = EVAL_DECODING

    def __post_init__(self) -> None:
        # The budget in force is recorded (run_config, the report), whichever way it was chosen.
        object.__setattr__(self, "max_prompt_tokens",
                           prompts.prompt_budget(self.task, self.max_prompt_tokens))

    @classmethod
    def of(cls, task: str, **settings: Any) -> EvalConfig:
        """A config from one flat set of settings: this class's own fields, and `Params`
        options on top of `EVAL_DECODING`; a value out of range is refused (EvalError) before
        any model loads."""
        own = {f.name for f in fields(cls)} - {"task", "decoding"}
        try:
            decoding = EVAL_DECODING.updated(
                **{name: value for name, value in settings.items() if name not in own})
        except (TypeError, ValueError) as exc:
            raise EvalError(str(exc)) from None
        return cls(task=task, decoding=decoding,
                   **{name: value for name, value in settings.items() if name in own})

    @property
    def max_new_tokens(self) -> int:
        return self.decoding.max_new_tokens

    def bounds(self, length: LengthPolicy | None) -> tuple[int, int]:
        """(min, max) new tokens of every method for a user with this length policy."""
        if not self.user_length or length is None:
            return 0, self.max_new_tokens
        return length.clamp(self.max_new_tokens)

    def params(self, spec: MethodSpec, length: LengthPolicy | None = None,
               user_texts: Sequence[str] = ()) -> Params:
        """`spec`'s settings for a user with this length policy whose retrieved texts are
        `user_texts` (as `Client` fits them on the device)."""
        low, high = self.bounds(length)
        return replace(self.decoding, method=spec.method, gamma=spec.gamma,
                       top_k=spec.top_k or self.decoding.top_k, max_new_tokens=high,
                       min_new_tokens=low).for_user(user_texts)


class MeteredChannel:
    """A FrameChannel that times how long the device waits on the companion.

    The companion computes apart from the device (its own thread or process), so only the time
    the device spends in `send` and `recv` counts: the companion's compute and the network
    where the device had nothing else to do, not what overlapped with its own work.
    """

    def __init__(self, inner: FrameChannel) -> None:
        self.inner = inner
        self.busy_s = 0.0  # companion compute + emulated network, as waited for by the device

    def send(self, frame: bytes) -> None:
        started = time.perf_counter()
        try:
            self.inner.send(frame)
        finally:
            self.busy_s += time.perf_counter() - started

    def recv(self, timeout: float) -> bytes:
        started = time.perf_counter()
        try:
            return self.inner.recv(timeout)
        finally:
            self.busy_s += time.perf_counter() - started

    def poll(self) -> bytes | None:
        poll = getattr(self.inner, "poll", None)
        return poll() if poll is not None else None

    def close(self) -> None:
        self.inner.close()


def _pin_threads(cores: set[int]) -> None:
    """Every thread of this process on `cores` (Linux pins one thread a call; the ones started
    later inherit their starter's)."""
    for tid in os.listdir("/proc/self/task"):
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cores)


def _drain(stream: IO[str]) -> None:
    for _ in stream:
        pass


@contextmanager
def companion_process(generalist: str, specialist: str, precision: str, threads: int,
                      rtt_ms: float) -> Iterator[Callable[[], FrameChannel]]:
    """The companion as deployed, for `Harness(connect=...)`: `specsteer-companion serve` in a
    child process (no GIL shared with the device: ONNX Runtime GenAI holds it during a pass),
    reached over a websocket through `DelayProxy` (half of `rtt_ms` each way). With one thread
    each and two cores or more, the device keeps core 0 and the companion gets core 1.
    `generalist` at `precision` and `specialist` (the device's folder: P_S0 is its artifact)
    are what `specsteer-companion serve` takes."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = threads == 1 and len(cores) >= 2
    proc, url = start_companion(generalist, specialist, precision, threads=threads,
                                core=cores[1] if pinned else None, die_with_parent=True)
    if proc.stdout is not None:  # what it prints after its ready line: drained, never blocking it
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    proxy = DelayProxy(int(url.rsplit(":", 1)[1]), rtt_ms / 2000.0)
    if pinned:
        _pin_threads({cores[0]})
    try:
        yield lambda: WebSocketChannel(f"ws://127.0.0.1:{proxy.port}")
    finally:
        if pinned:
            _pin_threads(set(cores))
        proxy.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass(frozen=True)
class Prepared:
    """An example's two prompt views plus what retrieval put in the private one."""

    device: DevicePrompt
    records: tuple[str, ...]
    truncated: tuple[str, ...]
    length: LengthPolicy | None = None  # the user's length policy from the retrieved records
    user_texts: tuple[str, ...] = ()  # the user's own texts among them (the examples' answers)


class Harness:
    """Loaded models and a way to reach a companion serving them; runs methods on examples."""

    def __init__(self, specialist: LanguageModel, generalist: LanguageModel | ModelFolder,
                 config: EvalConfig, connect: Callable[[], FrameChannel] | None = None) -> None:
        """`connect`: a fresh channel to a companion serving these two models, with the
        config's round trip applied on the way (`companion_process`); `generalist` may then
        be its folder's identity alone (`ModelFolder`: name, hash, tokenizer), the model
        being the companion's to load. None: the companion in this process, on its own
        thread (`ConcurrentChannel`), over the loaded `generalist`."""
        if specialist.tokenizer.vocab_hash != generalist.tokenizer.vocab_hash:
            raise EvalError(
                f"{specialist.name} and {generalist.name} have different tokenizers; the "
                "harness evaluates the same-tokenizer path (pick a Specialist/Generalist pair "
                "of one family, e.g. qwen2.5-0.5b with qwen2.5-1.5b)")
        prompts.get_task(config.task)  # raises UnknownTask naming the valid ones
        self.specialist = specialist
        self.generalist = generalist
        self.config = config
        self.companion = Companion.thread if connect is None else Companion.process
        self.verifier: Verifier | None = None  # the in-process companion's (thread mode)
        if connect is None:
            if isinstance(generalist, ModelFolder):
                raise EvalError("a companion in this process needs the Generalist loaded, "
                                "not its folder's identity")
            # its generic Specialist is the device's own artifact: share the loaded model
            verifier = Verifier(generalist, specialist)
            self.verifier = verifier
            connect = lambda: ConcurrentChannel.for_verifier(  # noqa: E731
                verifier, one_way_s=config.rtt_ms / 2000.0)
        self.connect = connect

    def prepare(self, example: Example) -> Prepared:
        """Fresh history from the profile, BM25 top-k, both prompts in the chat format."""
        tokenizer = self.specialist.tokenizer
        store = HistoryStore(memory=True)
        try:
            store.add_many(example.records)
            hits = prompts.retrieve(store, example.task, example.query, self.config.retrieve_k,
                                    before=example.before)
        finally:
            store.close()
        prompt = prompts.build_prompt(example.task, example.query, hits,
                                      count_tokens=tokenizer.count,
                                      max_prompt_tokens=self.config.max_prompt_tokens,
                                      min_example_tokens=self.config.min_example_tokens)

        def ids(private: bool) -> list[int]:
            chat = [Message(m["role"], m["content"]) for m in prompt.messages(private=private)]
            return tokenizer.chat_ids(chat)

        return Prepared(DevicePrompt(private_ids=ids(True), public_ids=ids(False)),
                        prompt.records, prompt.truncated, prompt.length,
                        tuple(text for _, text in prompt.examples))

    def _link(self) -> tuple[CompanionLink, MeteredChannel]:
        channel = MeteredChannel(self.connect())
        link = CompanionLink(channel)
        link.hello(generalist_sha256=self.generalist.sha256,
                   specialist_sha256=self.specialist.sha256)
        return link, channel

    def run(self, example: Example, prepared: Prepared, spec: MethodSpec,
            voices: Voices | None = None) -> dict[str, Any]:
        """One generation of `spec` on `example`, measured; returns a results row (with the
        length ratio and style similarity when `voices` of the run's users are given)."""
        params = self.config.params(spec, prepared.length, prepared.user_texts)
        prompt = prepared.device
        if spec.method == "llm":  # the baseline never uses c; keep the device's shadow work small
            prompt = DevicePrompt(private_ids=prompt.public_ids, public_ids=prompt.public_ids)
        link, channel = self._link() if spec.collaborative else (None, None)
        up0 = link.stats.bytes_up if link else 0  # the handshake is per connection, not per text
        down0 = link.stats.bytes_down if link else 0
        requests0 = link.stats.requests if link else 0
        busy0 = channel.busy_s if channel else 0.0
        stats = DecodeStats()
        started = time.perf_counter()
        try:
            # offline="fail": a companion fault must fail the row, not turn it into a local one
            tokens = [event.token for event in
                      decode(self.specialist, prompt, params, link, stats, offline="fail")]
            wall = time.perf_counter() - started
            bytes_up = link.stats.bytes_up - up0 if link else 0
            bytes_down = link.stats.bytes_down - down0 if link else 0
            round_trips = link.stats.requests - requests0 if link else 0
            companion_s = channel.busy_s - busy0 if channel else 0.0
        finally:
            if link is not None:
                link.close()
        text = self.specialist.tokenizer.decode(tokens).strip()
        scores = rouge(text, example.gold)
        ttft = stats.first_token_s if stats.first_token_s is not None else wall
        effective, effective_ttft = wall, ttft
        if spec.method == "llm":
            # device.decode runs the Specialist alongside every method, though "LLM alone" uses
            # none of it; on a shared CPU that work would slow the baseline, so it is taken out.
            effective = max(wall - stats.prefill_s - stats.device_s, 1e-9)
            effective_ttft = max(ttft - stats.prefill_s, 0.0)
        n = len(tokens)
        return {
            "user": example.user,
            "task": example.task,
            "method": spec.label,
            "base_method": spec.method,
            "gamma": spec.gamma if spec.method == "specsteer" else None,
            "text": text,
            "gold": example.gold,
            "rouge1": scores.rouge1,
            "rougeL": scores.rougeL,
            **(voices.measure(example.user, text) if voices is not None else {}),
            "min_new_tokens": params.min_new_tokens,
            "max_new_tokens": params.max_new_tokens,
            "tokens": n,
            "tokens_per_s": n / effective if effective > 0 else 0.0,
            "decode_tokens_per_s": (n - 1) / (effective - effective_ttft)
            if n > 1 and effective > effective_ttft else None,
            "acceptance": stats.acceptance_rate if stats.drafted else None,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "rounds": stats.rounds if spec.collaborative else 0,
            "round_trips": round_trips,
            "bytes_up": bytes_up,
            "bytes_down": bytes_down,
            "bytes_up_per_token": bytes_up / n if n else 0.0,
            "bytes_down_per_token": bytes_down / n if n else 0.0,
            "ttft_s": effective_ttft,
            "wall_s": wall,
            "effective_s": effective,
            "prefill_s": stats.prefill_s,
            "device_s": stats.device_s,
            "companion_s": companion_s,
            "degraded": stats.degraded,
            "private_prompt_tokens": len(prepared.device.private_ids),
            "public_prompt_tokens": len(prepared.device.public_ids),
            "context_records": len(prepared.records),
            "truncated_records": len(prepared.truncated),
            "rtt_ms": self.config.rtt_ms,
        }


# ------------------------------------------------------------------------------ results folder

def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a results.jsonl; a line cut short by an interrupted write is ignored."""
    target = Path(path)
    if not target.exists():
        return []
    rows = []
    for line in target.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _drop_partial_line(path: Path) -> None:
    """Cut a last line left without its newline by an interrupted write, so appends stay whole."""
    if not path.exists():
        return
    with path.open("rb+") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


def row_key(row: dict[str, Any]) -> tuple[str, str]:
    return str(row["user"]), str(row["method"])


def read_run_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings a results folder was made with (its run.json)."""
    return json.loads((Path(folder) / RUN_CONFIG).read_text(encoding="utf-8"))


def check_run_config(out: Path, config: dict[str, Any]) -> None:
    """Write run.json, or refuse to mix rows of a different setup into an existing folder."""
    path = out / RUN_CONFIG
    if path.exists():
        stored = read_run_config(out)
        changed = sorted(key for key in config if stored.get(key) != config[key])
        if changed:
            raise EvalError(
                f"{out} holds results of another setup ({', '.join(changed)} differ: "
                f"{ {k: stored.get(k) for k in changed} } there); use another --out folder")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def run_config(harness: Harness, data: str | None) -> dict[str, Any]:
    """The settings that make rows comparable (methods and user count may grow on resume):
    the run's own and every shared decoding setting, flat and as JSON holds them."""
    config = asdict(harness.config)
    decoding = config.pop("decoding")
    return json.loads(json.dumps({
        **config,
        **{name: value for name, value in decoding.items() if name not in PER_METHOD},
        "data": data,
        "companion": harness.companion.value,
        "specialist": harness.specialist.name,
        "specialist_sha256": harness.specialist.sha256,
        "generalist": harness.generalist.name,
        "generalist_sha256": harness.generalist.sha256,
    }))


ProgressFn = Callable[[Example, MethodSpec, "dict[str, Any] | None"], None]


def run_eval(harness: Harness, examples: Sequence[Example], methods: Sequence[MethodSpec],
             results: str | os.PathLike[str], progress: ProgressFn | None = None,
             ) -> Iterator[dict[str, Any]]:
    """Run every (example x method) not yet in `results`, appending each row as it finishes.

    Yields the new rows; `progress(example, method, row)` is called after each generation
    (row None when it was already there). Duplicate user names are a data error: the resume
    key is (user, method). Style similarity compares each output with the other users of
    `examples`.
    """
    users = [example.user for example in examples]
    if len(set(users)) != len(users):
        raise EvalError("two examples share a user name; resume needs unique users")
    voices = Voices(examples)
    path = Path(results)
    _drop_partial_line(path)
    done = {row_key(row) for row in read_results(path)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as sink:
        for example in examples:
            todo = [spec for spec in methods if (example.user, spec.label) not in done]
            prepared = harness.prepare(example) if todo else None
            for spec in methods:
                if prepared is None or spec not in todo:
                    if progress is not None:
                        progress(example, spec, None)
                    continue
                row = harness.run(example, prepared, spec, voices)
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                sink.flush()
                done.add(row_key(row))
                if progress is not None:
                    progress(example, spec, row)
                yield row
