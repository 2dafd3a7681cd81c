"""Load benchmark: N simulated devices against one companion process.

The companion is a real `specsteer-companion serve` subprocess (tiny models by default,
`--generalist/--specialist` for compiled registry models). One real `Client` first records a few
generations through a frame tap: every request frame, the replies it got, and the device's own
time between a reply and its next request (drafting, fusing). Then for each N (1, 4, 8, 16
by default) N simulated devices replay those conversations concurrently, each over its own
websocket (`specsteer.transport.WebSocketChannel`, the SDK's channel) and under its own client
name (the companion's session quota is per identity). Devices sleep the recorded device time
between rounds (`--no-pacing` hammers instead), so the companion sees the request pattern of
real devices without this box spending CPU on their Specialists. Greedy decoding makes every
reply reproducible: a reply that differs from the recorded one counts as an error, like a
refused or dropped request.

Reported per N: aggregate generated tokens/s (tokens of the replayed generations / wall time),
rounds/s, p50/p99 round latency (Draft -> Verdict or RowRequest -> RowReply, timed around the
channel on the device), p50 session-open latency, the CPU the companion process used (cores, to
tell a saturated companion from an idle one), and errors (must be 0).

`--batch on` serves with cross-session batching (`specsteer-companion serve --batch`), `--batch
both` runs a plain companion and then a batching one on the same recorded traces, so the two
tables compare directly (and every batched reply is checked against the plain companion's).

    python bench/load.py --devices 1 4 8 16 --generations 6 --batch both --json bench-load.json

`--abusers K` runs the starvation scenario of issue 19 instead: one legitimate device replays
its recorded generations alone, then again while K other token holders (each its own device
token in the companion's store, each its own process, so that their frames are not built under
the measured device's GIL) make the companion prefill as fast as it answers, reconnecting
whenever it refuses them: `--attack reopen` reopens sessions over `--abuser-prompt-tokens`-token
prompts (issue 19), `--attack committed` opens a 1-token session and sends Drafts whose
`committed_ids` carry `--abuser-prompt-tokens` ids each (issue 28: committed ids were not
charged to the prompt budget; a Draft now commits at most `max_draft + 1` ids, so 17 is the
most a companion serves and more is refused). Reported: the legitimate
device's round latency (p50/p99) alone and under abuse, and the abusers' served and refused
opens. It runs on a companion with the default limits and on one with the prompt budget lifted
(what fair scheduling does alone); `--before-pythonpath DIR` adds a companion run from another
checkout (the code before the defences) for the "before" number:

    python bench/load.py --abusers 3 --workers 1 --generations 8 --json bench-starvation.json
    python bench/load.py --abusers 3 --attack committed --abuser-prompt-tokens 17 --workers 1 \
        --generations 8 --companion-core 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from specsteer import protocol
from specsteer.client import NO_TOKEN, Client
from specsteer.errors import SpecSteerError
from specsteer.history import HistoryStore
from specsteer.runtime import load_model
from specsteer.transport import WebSocketChannel
from specsteer_companion.process import start_companion

QUERIES = [
    "Budget for the next quarter",
    "Meeting notes and the revised draft",
    "Questions about the slides",
    "Review of pull request 42",
]
HISTORY = [
    ("Budget for the next quarter", "Dear team, the budget for the next quarter stays as it is."),
    ("Meeting notes", "Thank you for the meeting notes, I will send the revised draft by Friday."),
    ("Slides", "Please find attached the slides; let me know if you have questions."),
]
ROUND_TYPES = (protocol.Draft, protocol.RowRequest)
REPLY_TIMEOUT_S = 60.0


@dataclass
class Step:
    """One request of a recorded conversation: the frame, its replies, the device time before."""

    frame: bytes
    replies: list[bytes]
    think_s: float  # device time between the previous reply and this request


@dataclass
class Trace:
    steps: list[Step]
    tokens: int


@dataclass
class Level:
    """What N concurrent devices got."""

    devices: int
    generations: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    rounds: int
    rounds_per_s: float
    round_p50_ms: float
    round_p99_ms: float
    round_mean_ms: float
    open_p50_ms: float
    companion_cpu: float | None  # cores the companion process used on average (None: no /proc)
    errors: int
    error_samples: list[str] = field(default_factory=list)


def record(client: Client, query: str, params: dict) -> Trace:
    """One real generation through the tap: requests, replies and device time between them."""
    events: list[tuple[float, str, bytes]] = []
    client.tap = lambda direction, frame: events.append((time.perf_counter(), direction, frame))
    try:
        result = client.generate(query, offline="fail", **params)
    finally:
        client.tap = None
    steps: list[Step] = []
    last_reply_at: float | None = None
    for stamp, direction, frame in events:
        if direction == "up":
            think = 0.0 if last_reply_at is None else max(0.0, stamp - last_reply_at)
            steps.append(Step(frame, [], think))
        else:
            steps[-1].replies.append(frame)
            last_reply_at = stamp
    return Trace(steps, len(result.tokens))


def _same(recorded: bytes, got: bytes) -> bool:
    """Replies are reproducible except the session id, which the companion numbers itself."""
    a, b = protocol.decode(recorded, protocol.Limits()), protocol.decode(got, protocol.Limits())
    if isinstance(a, protocol.SessionOpened) and isinstance(b, protocol.SessionOpened):
        return a.prompt_length == b.prompt_length
    return a == b


def replay(
    url: str, trace: Trace, name: str, pacing: bool, rounds_ms: list[float], opens_ms: list[float]
) -> None:
    """One simulated device: the recorded conversation, timed request by request."""
    channel = WebSocketChannel(url, open_timeout=REPLY_TIMEOUT_S)
    try:
        for step in trace.steps:
            message = protocol.decode(step.frame, protocol.Limits())
            frame = step.frame
            if isinstance(message, protocol.Hello):  # each device is its own identity
                frame = protocol.encode(
                    protocol.Hello(
                        message.generalist_sha256,
                        message.specialist_sha256,
                        message.auth_token,
                        name,
                    )
                )
            if pacing and step.think_s:
                time.sleep(step.think_s)
            started = time.perf_counter()
            channel.send(frame)
            for expected in step.replies:
                got = channel.recv(REPLY_TIMEOUT_S)
                if not _same(expected, got):
                    raise SpecSteerError(
                        f"{type(message).__name__}: reply differs from the "
                        f"recorded one: {protocol.decode(got, protocol.Limits())}"
                    )
            elapsed_ms = (time.perf_counter() - started) * 1e3
            if isinstance(message, ROUND_TYPES):
                rounds_ms.append(elapsed_ms)
            elif isinstance(message, protocol.OpenSession):
                opens_ms.append(elapsed_ms)
    finally:
        channel.close()


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_tree(pid: int) -> dict[int, list[str]]:
    """`pid` and its descendants (Linux /proc), each with its /proc stat fields."""
    stats = {int(p.name): s for p in Path("/proc").iterdir()
             if p.name.isdigit() and (s := _stat(int(p.name))) is not None}
    if pid not in stats:
        return {}
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, s in stats.items() if int(s[1]) == parent]
        tree.update(children)
        frontier += children
    return {p: stats[p] for p in tree}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and its descendants: whether the companion
    saturates, its engine's processes (vLLM's core and worker) included."""
    tree = process_tree(pid)
    if not tree:
        return None
    ticks = sum(int(stat[11]) + int(stat[12]) for stat in tree.values())
    return ticks / os.sysconf("SC_CLK_TCK")


def run_level(
    url: str, traces: list[Trace], devices: int, generations: int, pacing: bool, companion_pid: int
) -> Level:
    rounds_ms: list[float] = []
    opens_ms: list[float] = []
    errors: list[str] = []
    tokens = [0] * devices
    start = threading.Barrier(devices + 1)

    def device(number: int) -> None:
        start.wait()
        for g in range(generations):
            trace = traces[(number + g) % len(traces)]
            try:
                replay(url, trace, f"load-device-{number}", pacing, rounds_ms, opens_ms)
                tokens[number] += trace.tokens
            except (SpecSteerError, OSError) as exc:
                errors.append(f"device {number}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=device, args=(n,)) for n in range(devices)]
    for thread in threads:
        thread.start()
    start.wait()
    began, cpu_before = time.perf_counter(), cpu_seconds(companion_pid)
    for thread in threads:
        thread.join()
    wall, cpu_after = time.perf_counter() - began, cpu_seconds(companion_pid)
    cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / wall
    rounds = np.asarray(rounds_ms) if rounds_ms else np.zeros(1)
    return Level(
        devices=devices,
        generations=devices * generations,
        tokens=sum(tokens),
        wall_s=wall,
        tokens_per_s=sum(tokens) / wall,
        rounds=len(rounds_ms),
        rounds_per_s=len(rounds_ms) / wall,
        round_p50_ms=float(np.percentile(rounds, 50)),
        round_p99_ms=float(np.percentile(rounds, 99)),
        round_mean_ms=float(rounds.mean()),
        open_p50_ms=statistics.median(opens_ms) if opens_ms else 0.0,
        companion_cpu=cpu,
        errors=len(errors),
        error_samples=errors[:5],
    )


def table(levels: list[Level], title: str) -> Table:
    out = Table(title=title)
    for name in [
        "devices",
        "generations",
        "tokens/s",
        "rounds/s",
        "round p50 ms",
        "round p99 ms",
        "p50 vs 1 device",
        "open p50 ms",
        "companion CPU",
        "errors",
    ]:
        out.add_column(name, justify="right")
    base = levels[0].round_p50_ms or 1.0
    for lv in levels:
        out.add_row(
            str(lv.devices),
            str(lv.generations),
            f"{lv.tokens_per_s:.0f}",
            f"{lv.rounds_per_s:.0f}",
            f"{lv.round_p50_ms:.1f}",
            f"{lv.round_p99_ms:.1f}",
            f"{lv.round_p50_ms / base:.1f}x",
            f"{lv.open_p50_ms:.1f}",
            "-" if lv.companion_cpu is None else f"{lv.companion_cpu:.2f} cores",
            str(lv.errors),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generalist", help="registry name or compiled folder (default: tiny seed 1)")
    ap.add_argument("--specialist", help="registry name or compiled folder (default: tiny seed 0)")
    ap.add_argument("--precision", default="int8", help="precision of registry models")
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--generations", type=int, default=6, help="per device and level")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--method", default="specsteer")
    ap.add_argument("--workers", type=int, default=2, help="companion verify threads")
    ap.add_argument("--threads", type=int, default=1, help="threads per companion model")
    ap.add_argument(
        "--batch",
        choices=["off", "on", "both"],
        default="off",
        help="serve with cross-session batching (`serve --batch`); both: one companion after "
        "the other, replaying the same traces",
    )
    ap.add_argument(
        "--no-pacing",
        action="store_true",
        help="send each request as soon as the previous reply arrived",
    )
    ap.add_argument("--abusers", type=int, default=0,
                    help="starvation scenario: token holders making the companion prefill "
                    "(--attack; 0: off)")
    ap.add_argument("--abuser-prompt-tokens", type=int, default=2040)
    ap.add_argument("--attack", choices=["reopen", "committed"], default="reopen",
                    help="with --abusers: long prompts reopened, or long committed_ids in Drafts")
    ap.add_argument("--abuse-warmup-s", type=float, default=3.0,
                    help="abuse before the device is measured (spends the first burst)")
    ap.add_argument("--companion-core", type=int,
                    help="with --abusers: pin the companion to this core and the device and the "
                    "abusers to the others (remote abusers do not take the companion's CPU)")
    ap.add_argument("--before-pythonpath",
                    help="with --abusers: also run a companion from this source path")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.generalist is None or args.specialist is None:
        from specsteer.models.tiny import tiny_model_dir

        args.generalist = args.generalist or str(tiny_model_dir("llama", seed=1))
        args.specialist = args.specialist or str(tiny_model_dir("llama", seed=0))
    console = Console(width=140)
    if args.abusers:
        if args.companion_core is not None:
            os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.companion_core})
        results = starvation(args, console)
        console.print(starvation_table(results, args))
        if args.json:
            args.json.write_text(json.dumps({"config": {k: v for k, v in vars(args).items()
                                                        if k != "json"},
                                             "starvation": results}, indent=2))
        if any(r[level]["errors"] for r in results for level in ("alone", "abused")):
            sys.exit(1)
        return
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.batch]
    traces: list[Trace] = []
    runs: dict[bool, list[Level]] = {}
    for batch in modes:
        proc, url = start_companion(
            args.generalist,
            args.specialist,
            args.precision,
            specialist_precision=args.precision,  # what the recording device loads
            threads=args.threads,
            workers=args.workers,
            batch=batch,
        )
        try:
            if not traces:  # recorded once, on the first companion: every run replays the same
                traces = record_traces(args, url)
            runs[batch] = []
            for n in args.devices:
                level = run_level(url, traces, n, args.generations, not args.no_pacing, proc.pid)
                runs[batch].append(level)
                console.print(
                    f"{'batched' if batch else 'plain'} N={n}: {level.tokens_per_s:.0f} tok/s, "
                    f"p50 {level.round_p50_ms:.1f} ms, errors {level.errors}"
                )
        finally:
            proc.terminate()
            proc.wait(10)
    rounds = sum(
        sum(isinstance(protocol.decode(s.frame, protocol.Limits()), ROUND_TYPES) for s in t.steps)
        for t in traces
    )
    for batch, levels in runs.items():
        title = (
            f"{Path(args.generalist).name} + {Path(args.specialist).name}, {args.method}, "
            f"{args.max_new_tokens} new tokens, "
            f"{'batched (serve --batch)' if batch else f'{args.workers} workers, not batched'}, "
            f"{'paced' if not args.no_pacing else 'unpaced'}; traces: "
            f"{sum(t.tokens for t in traces)} tokens in {rounds} rounds"
        )
        console.print(table(levels, title))
        for lv in levels:
            for sample in lv.error_samples:
                console.print(f"[red]{sample}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": {k: v for k, v in vars(args).items() if k != "json"},
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                    "runs": [
                        {"batch": batch, "levels": [asdict(lv) for lv in levels]}
                        for batch, levels in runs.items()
                    ],
                },
                indent=2,
            )
        )
    if any(lv.errors for levels in runs.values() for lv in levels):
        sys.exit(1)


ABUSE_FIELDS = ("prefilled", "refused", "logins", "dropped")
# prefilled: long prefills served (prompts reopened, or committed_ids verified); refused:
# OpenSessions, Drafts or Hellos answered with an Error (the connection then ends); dropped:
# connections that failed otherwise (refused at accept, reset, timeout)


class Tally:
    """What one abuser got: counts in an array its siblings share, reasons of its own."""

    def __init__(self, counts) -> None:  # type: ignore[no-untyped-def]
        self.counts, self.reasons = counts, {}

    def add(self, field_name: str, n: int = 1) -> None:
        with self.counts.get_lock():
            self.counts[ABUSE_FIELDS.index(field_name)] += n

    def refused_because(self, why: str) -> None:
        self.add("refused")
        self.reasons[why] = self.reasons.get(why, 0) + 1


def abuser_process(url: str, hello: protocol.Hello, token: str, opening: protocol.OpenSession,
                   attack: str, stop, counts, reasons) -> None:  # type: ignore[no-untyped-def]
    """One abusing token holder in a process of its own (another machine, in effect: its
    frames are not encoded under the measured device's GIL); its reasons go to `reasons`."""
    tally = Tally(counts)
    try:
        abuse(url, hello, token, opening, stop, tally, attack)
    finally:
        reasons.put(tally.reasons)


def abuse(url: str, hello: protocol.Hello, token: str, opening: protocol.OpenSession,
          stop, tally: Tally, attack: str) -> None:  # type: ignore[no-untyped-def]
    """One token holder: log in, make the companion prefill `opening`'s prompt again and again
    (reopened, or as the committed ids of Drafts in a 1-token session) until refused;
    reconnect."""
    short = protocol.OpenSession(opening.prompt_ids[:1], opening.settings)
    while not stop.is_set():
        try:
            channel = WebSocketChannel(url, open_timeout=REPLY_TIMEOUT_S)
        except (SpecSteerError, OSError):
            tally.add("dropped")
            time.sleep(0.01)
            continue
        try:
            reply = _exchange(channel, protocol.Hello(
                hello.generalist_sha256, hello.specialist_sha256, token, "abuser"))
            if not isinstance(reply, protocol.Error):
                tally.add("logins")
                if attack == "committed":
                    reply = _exchange(channel, short)
            number = 0
            while not stop.is_set() and not isinstance(reply, protocol.Error):
                request: protocol.Message = opening if attack == "reopen" else \
                    protocol.Draft(number, opening.prompt_ids, ())
                reply = _exchange(channel, request)
                number += 1
                if isinstance(reply, protocol.SessionOpened | protocol.Verdict):
                    tally.add("prefilled")
            if isinstance(reply, protocol.Error):
                tally.refused_because(reply.message.split(":")[0])
        except (SpecSteerError, OSError):
            tally.add("dropped")
        finally:
            channel.close()


def _exchange(channel: WebSocketChannel, message: protocol.Message) -> protocol.Message:
    channel.send(protocol.encode(message))
    return protocol.decode(channel.recv(REPLY_TIMEOUT_S), protocol.Limits())


def starvation(args: argparse.Namespace, console: Console) -> list[dict]:
    """The legitimate device's rounds alone and beside `args.abusers` long-prompt abusers, on a
    companion with the default limits, one with the prompt budget lifted, and optionally one
    run from `args.before_pythonpath`."""
    from specsteer_companion.auth import TokenStore

    lifted = ["--prefill-rate", "1e9", "--prefill-burst", "1000000000"]
    companions = [("defaults", []), ("prompt budget lifted", lifted)]
    if args.before_pythonpath:
        companions.append((f"before ({args.before_pythonpath})", []))
    results: list[dict] = []
    traces: list[Trace] = []
    with tempfile.TemporaryDirectory() as home:
        store_path = Path(home) / "tokens.db"
        store = TokenStore(store_path)
        legit = store.create("legit-device").secret
        abusers = [store.create(f"abuser-{i}").secret for i in range(args.abusers)]
        for name, extra in companions:
            # a "before" companion imports from that checkout; this process keeps its code
            env = {"PYTHONPATH": args.before_pythonpath} if name.startswith("before") else None
            proc, url = start_companion(
                args.generalist, args.specialist, args.precision,
                specialist_precision=args.precision, threads=args.threads,
                workers=args.workers, open_access=False, env=env, core=args.companion_core,
                args=["--tokens", str(store_path), *extra])
            try:
                if not traces:
                    traces = record_traces(args, url, legit)
                hello, opening = _hello_and_open(traces[0], args.abuser_prompt_tokens)
                alone = run_level(url, traces, 1, args.generations, not args.no_pacing, proc.pid)
                ctx = multiprocessing.get_context("spawn")
                stop, counts, reasons_out = ctx.Event(), ctx.Array("q", len(ABUSE_FIELDS)), \
                    ctx.Queue()
                abusing = [ctx.Process(target=abuser_process, daemon=True, args=(
                    url, hello, token, opening, args.attack, stop, counts, reasons_out))
                    for token in abusers]
                for process in abusing:
                    process.start()
                time.sleep(args.abuse_warmup_s)  # past the abusers' first burst
                start = list(counts)
                abused = run_level(url, traces, 1, args.generations, not args.no_pacing,
                                   proc.pid)
                during = {name: counts[i] - start[i] for i, name in enumerate(ABUSE_FIELDS)}
                stop.set()
                reasons: dict[str, int] = {}
                for _ in abusing:
                    for why, n in reasons_out.get(timeout=REPLY_TIMEOUT_S * 2).items():
                        reasons[why] = reasons.get(why, 0) + n
                for process in abusing:
                    process.join(REPLY_TIMEOUT_S)
            finally:
                proc.terminate()
                proc.wait(10)
            results.append(dict(
                companion=name, alone=asdict(alone), abused=asdict(abused),
                abuse=dict(during, prefilled_per_s=during["prefilled"] / abused.wall_s,
                           prompt_tokens_per_s=during["prefilled"] * args.abuser_prompt_tokens
                           / abused.wall_s, reasons_whole_run=reasons)))
            console.print(f"{name}: round p50 {alone.round_p50_ms:.1f} ms alone, "
                          f"{abused.round_p50_ms:.1f} ms beside {args.abusers} abusers "
                          f"({during['prefilled']} long prefills served, {during['refused']} "
                          "refused meanwhile)")
    return results


def starvation_table(results: list[dict], args: argparse.Namespace) -> Table:
    what = ("reopening {n}-token prompts" if args.attack == "reopen" else
            "sending Drafts with {n} committed ids").format(n=args.abuser_prompt_tokens)
    out = Table(title=f"one device's rounds beside {args.abusers} token holders {what} "
                      f"({args.workers} worker(s), "
                      f"{Path(args.generalist).name} + {Path(args.specialist).name})")
    for name in ["companion", "p50 alone ms", "p99 alone", "p50 abused ms", "p99 abused",
                 "p50 ratio", "long prefills served/s", "refused", "device errors"]:
        out.add_column(name, justify="right")
    for r in results:
        alone, abused, abuse_ = r["alone"], r["abused"], r["abuse"]
        out.add_row(r["companion"], f"{alone['round_p50_ms']:.1f}",
                    f"{alone['round_p99_ms']:.1f}", f"{abused['round_p50_ms']:.1f}",
                    f"{abused['round_p99_ms']:.1f}",
                    f"{abused['round_p50_ms'] / max(alone['round_p50_ms'], 1e-9):.1f}x",
                    f"{abuse_['prefilled_per_s']:.1f}", str(abuse_["refused"]),
                    str(alone["errors"] + abused["errors"]))
    return out


def _hello_and_open(trace: Trace, prompt_tokens: int) -> tuple[protocol.Hello,
                                                               protocol.OpenSession]:
    """The recorded Hello (its model hashes) and OpenSession (its settings), the prompt
    repeated to `prompt_tokens` ids."""
    messages = [protocol.decode(step.frame, protocol.Limits()) for step in trace.steps]
    hello = next(m for m in messages if isinstance(m, protocol.Hello))
    opened = next(m for m in messages if isinstance(m, protocol.OpenSession))
    ids = list(opened.prompt_ids)
    prompt = (ids * (prompt_tokens // len(ids) + 1))[:prompt_tokens]
    return hello, protocol.OpenSession(tuple(prompt), opened.settings)


def record_traces(args: argparse.Namespace, url: str, token: str = "") -> list[Trace]:
    """One real generation per query through the companion at `url`."""
    store = HistoryStore(memory=True)
    for title, body in HISTORY:
        store.add(kind="email", title=title, body=body)
    client = Client(  # a slow engine (vLLM on a CPU) may take long over a prompt's prefill
        load_model(args.specialist, precision=args.precision), history=store, companion=url,
        token=token or NO_TOKEN, timeout_s=REPLY_TIMEOUT_S, connect_timeout_s=REPLY_TIMEOUT_S,
    )
    params = {"method": args.method, "max_new_tokens": args.max_new_tokens}
    return [record(client, query, params) for query in QUERIES]


if __name__ == "__main__":
    main()
