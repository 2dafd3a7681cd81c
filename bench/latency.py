"""The user's whole wait: time to first token and total time, real models over a real socket.

Device (this process, core 0) and companion (`specsteer-companion serve` child, core 1) talk
through `DelayProxy`, a loopback TCP proxy that holds every chunk for half the emulated round
trip in each direction. Per user of the newsgroups email task (or the persona of
`sample_apps/data` writing the demo's letter, `--persona`) and per round trip, one run each:
  * SpecSteer with the Client's default settings (what an app gets without `prepare`);
  * SpecSteer cold (warm_start off: the private prefill beside the companion's session
    opening), SpecSteer warm start (always: `warm_start_min_s` 0), SpecSteer after
    `Client.prepare` (TTFT counted from the final request, prefill done while "typing");
  * SpecSteer cold with P_S0 on the companion (`s0_on_device=False`, the paper's placement);
  * SpecSteer with the adaptive K (`adaptive_k`) and at gamma 0.1 with 32 candidates (the
    `fast` preset's): the other defaults one could choose, measured beside this one;
  * the Generalist alone (the LLM baseline over the same socket path: the cloud model alone);
  * SLM+RAG (device only; the same at every round trip, run once per user).
Ratios are against the Generalist alone of the same user and round trip, from this run; one
unmeasured generation of each kind runs first (`warm_up`).
"opens as G": the text's first 8 tokens are the Generalist alone's (a warm start's opening is
the Generalist's own, written from the public request); ROUGE-L against what the user wrote.
Also: prefill tokens/s of the Specialist per thread count (and the implied multiply-add rate),
and how long a cancel takes to stop the generation: during the prefill (no companion), and
during the rounds of a prepared generation (cancels at spread-out moments, per round trip).
"After `prepare`": `Client.prepare` with the same options, waited for (the user was still
typing), then TTFT from the final request: its private prefill and its companion session
(hello, the companion's prefill of the public prompt) are done ahead.

    flock /tmp/specsteer-heavy.lock python bench/latency.py --users 4 --rtt 50 --threads 1
    flock /tmp/specsteer-heavy.lock python bench/latency.py --users 4 --rtt 50 --threads 2
    flock /tmp/specsteer-heavy.lock python bench/latency.py --persona --rtt 0 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specsteer.client import Client, Result
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_device_model, load_model
from specsteer.runtime.track import Track
from specsteer_companion.process import start_companion
from specsteer_lab.eval.data import shared_file
from specsteer_lab.eval.metrics import rouge
from specsteer_lab.network import DelayProxy

DEVICE_CORE, COMPANION_CORE = 0, 1


def timed(client: Client, query: object, task: str, **params: object) -> tuple[float, float,
                                                                             Result]:
    """(time to first token, total time, result) of one streamed generation."""
    started, first = time.perf_counter(), None
    stream = client.stream(query, task=task, **params)  # type: ignore[arg-type]
    for _ in stream:
        first = first if first is not None else time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started, stream.result


def prefill_rate(model, ids: Sequence[int]) -> float:
    """Prompt tokens per second of one cold chunked prefill."""
    track = Track(model, ids, len(ids) + 8, lazy=True)
    started = time.perf_counter()
    track.prefill()
    seconds = time.perf_counter() - started
    track.close()
    return len(ids) / seconds


class StampedEvent(threading.Event):
    """An Event remembering when it was set."""

    set_at: float | None = None

    def set(self) -> None:
        self.set_at = time.perf_counter()
        super().set()


def cancel_stop_s(client: Client, query: object, delay: float, **params: object
                  ) -> float | None:
    """Seconds from the moment a cancel was due (`delay` s into a streamed generation) until
    the stream ended (None: it ended first). Counted from when it was due, not from when the
    timer thread got to set it: a model pass that holds the GIL delays the setting as well,
    and a user's stop button waits for both."""
    stamped = StampedEvent()
    timer = threading.Timer(delay, stamped.set)
    due = time.perf_counter() + delay
    timer.start()
    for _ in client.stream(query, task="email", cancel=stamped, **params):  # type: ignore[arg-type]
        pass
    ended = time.perf_counter()
    timer.cancel()
    return None if stamped.set_at is None else ended - due


def writers(args: argparse.Namespace) -> list[tuple[str, HistoryStore, object, str | None,
                                                     int | None]]:
    """(label, history store, request, what the user wrote, prompt budget) per writer."""
    if args.persona:
        from specsteer_lab.demo import PERSONA_QUERY, persona_store

        return [("persona", persona_store(), PERSONA_QUERY, None, args.max_prompt_tokens or 640)]
    out = []
    for user in range(args.users):
        shared = load_shared_user(args.data or shared_file("email"), user, task="email")
        store = HistoryStore(memory=True)
        store.add_many(shared.records)
        out.append((str(user), store, shared.query, shared.gold, args.max_prompt_tokens))
    return out


def run_row(client: Client, query: object, gold: str | None, config: str, user: str,
            rtt: float | None, **params: object) -> dict:
    """One streamed generation as a table row (the result's tokens kept for "opens as G")."""
    ttft, total, res = timed(client, query, "email", **params)
    s = res.stats
    return dict(user=user, rtt=rtt, config=config, ttft=ttft, total=total, tokens=s.tokens,
                warm=s.warm_tokens, switch=s.switch_s, acc=s.acceptance_rate,
                prefill=s.prefill_s, ready=s.session_ready_s, ids=res.tokens,
                session_reused=s.session_reused, drafted_ahead=s.drafted_ahead,
                rounds=s.rounds, device_s=s.device_s, wait_s=s.wait_s, pipelined=s.pipelined,
                accept_lengths=s.accept_lengths,
                rougeL=None if gold is None else rouge(res.text, gold).rougeL, text=res.text)


def measure_writer(args: argparse.Namespace, specialist, upstream: int, label: str,
                   store: HistoryStore, query: object, gold: str | None, budget: int | None,
                   extra: dict) -> list[dict]:
    """Every configuration of one writer at every round trip (see the module docstring)."""
    def client(url: str | None) -> Client:
        return Client(specialist, history=store, companion=url, max_prompt_tokens=budget)

    common = dict(preset=args.preset, max_new_tokens=args.max_new_tokens)
    _, prompt = client(None).render(query, task="email")
    rate = prefill_rate(specialist, prompt.private_ids)
    info = extra[f"user{label}"] = {"private_tokens": len(prompt.private_ids),
                                    "public_tokens": len(prompt.public_ids),
                                    "prefill_tok_s": rate}
    console.print(f"user {label}: private {len(prompt.private_ids)} tokens, public "
                  f"{len(prompt.public_ids)}; prefill {rate:.1f} tok/s")
    if args.cancels:
        info["cancel_prefill_stop_s"] = [cancel_stop_s(client(None), query, delay,
                                                       max_new_tokens=8)
                                         for delay in (0.3, 0.75, 1.2)]
    rows = [run_row(client(None), query, gold, "SLM+RAG", label, None, method="slm_rag",
                    **common)]
    for rtt in args.rtt:
        proxy = DelayProxy(upstream, rtt / 2000.0)
        via = f"ws://127.0.0.1:{proxy.port}"
        for name, params in CONFIGS.items():
            if wanted(args, name):
                rows.append(run_row(client(via), query, gold, name, label, rtt, **params,
                                    **common))
        if wanted(args, "SpecSteer prepared"):
            prepared = client(via)
            prepared.prepare(query, task="email", **common).wait()
            rows.append(run_row(prepared, query, gold, "SpecSteer prepared", label, rtt,
                                **common))
            if args.cancels:
                stops = []
                for delay in (0.15, 0.4, 0.65):  # cancels during the first rounds
                    prepared.prepare(query, task="email", **common).wait()
                    stops.append(cancel_stop_s(prepared, query, delay, **common))
                info[f"cancel_round_stop_s@{rtt:g}"] = stops
            prepared.close()
        proxy.close()
        console.print(f"user {label} rtt {rtt:g} ms done")
    return rows


def warm_up(specialist, upstream: int, store: HistoryStore, query: object) -> None:
    """One short unmeasured generation of each kind first: the companion's first session
    (its memory arena, its thread pool) and the device's first passes would otherwise be
    counted against whichever configuration the first writer runs first."""
    client = Client(specialist, history=store, companion=f"ws://127.0.0.1:{upstream}")
    for method in ("llm", "specsteer"):
        client.generate(query, task="email", method=method, max_new_tokens=8)  # type: ignore
    client.close()


def wanted(args: argparse.Namespace, name: str) -> bool:
    """Whether configuration `name` runs (`--only`)."""
    return not args.only or name in args.only


# the configurations run at every round trip, before "SpecSteer prepared"
CONFIGS: dict[str, dict[str, object]] = {
    "Generalist alone": dict(method="llm"),
    "SpecSteer default": {},  # the Client's own defaults: what an app gets without prepare
    "SpecSteer cold": dict(warm_start=False),
    "SpecSteer warm start": dict(warm_start=True, warm_start_min_s=0.0),
    # the paper's placement (the default before latency run 7): the companion runs P_S0
    "SpecSteer cold, P_S0 on the companion": dict(warm_start=False, s0_on_device=False),
    "SpecSteer adaptive K": dict(adaptive_k=True),
    "SpecSteer gamma 0.1": dict(gamma=0.1, top_k=32),
}
console = Console(width=190)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--generalist", default="qwen2.5-1.5b")
    ap.add_argument("--precision", default="int8", help="the Generalist's")
    ap.add_argument("--specialist-precision", default=None,
                    help="the device's Specialist's (default: what a Client loads by name)")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--persona", action="store_true",
                    help="the demo's persona and letter instead of newsgroups users")
    ap.add_argument("--rtt", type=float, nargs="+", default=[0.0, 50.0, 150.0],
                    help="emulated round trips, ms")
    ap.add_argument("--threads", type=int, default=1, help="device ONNX Runtime threads")
    ap.add_argument("--runtime", choices=("device", "genai"), default="device",
                    help="the device's runtime: raw ONNX Runtime as a Client loads it "
                         "(`load_device_model`), or ONNX Runtime GenAI (`load_model`)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="private prompt budget (default: the task's, as a Client gives it; "
                         "the persona: the demo's 640)")
    ap.add_argument("--preset", default=None, help="default: the Client's (none)")
    ap.add_argument("--cancels", action="store_true", help="also time cancels")
    ap.add_argument("--only", nargs="+", choices=[*CONFIGS, "SpecSteer prepared"],
                    help="run these configurations only (the Generalist alone is the ratios' "
                         "base: keep it)")
    ap.add_argument("--data", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        cores = {DEVICE_CORE} if args.threads == 1 else set(range(args.threads))
        os.sched_setaffinity(0, cores)
    loader = load_device_model if args.runtime == "device" else load_model
    specialist = loader(args.specialist, precision=args.specialist_precision,
                        threads=args.threads)
    proc, url = start_companion(args.generalist, str(specialist.folder), args.precision,
                                core=COMPANION_CORE)
    upstream = int(url.rsplit(":", 1)[1])
    rows: list[dict] = []
    extra: dict[str, object] = {"threads": args.threads, "runtime": args.runtime,
                                "specialist_precision": specialist.precision}
    try:
        every = writers(args)
        _, first_store, first_query, *_ = every[0]
        warm_up(specialist, upstream, first_store, first_query)
        for label, store, query, gold, budget in every:
            rows += measure_writer(args, specialist, upstream, label, store, query, gold,
                                   budget, extra)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    report(args, specialist, rows, extra)


def report(args: argparse.Namespace, specialist, rows: list[dict], extra: dict) -> None:
    table = Table(title=f"{args.specialist} {specialist.precision} + {args.generalist} "
                        f"{args.precision}, preset {args.preset or 'none'}, "
                        f"{args.max_new_tokens} new tokens, device threads {args.threads}, "
                        f"device runtime {args.runtime}")
    for col in ("user", "RTT ms", "configuration", "TTFT s", "TTFT x G", "total s", "tokens",
                "speed x G", "prefill s", "session s", "warm tokens", "switch s",
                "opens as G", "ROUGE-L"):
        table.add_column(col)
    base = {(r["user"], r["rtt"]): r for r in rows if r["config"] == "Generalist alone"}
    for r in rows:
        g = base.get((r["user"], r["rtt"])) or base.get((r["user"], args.rtt[0]))
        speed = (r["tokens"] / r["total"]) / (g["tokens"] / g["total"]) if g else float("nan")
        r["ttft_x_g"] = r["ttft"] / g["ttft"] if g else None
        r["speed_x_g"] = speed
        r["opens_as_g"] = bool(g) and r["ids"][:8] == g["ids"][:8]
        table.add_row(r["user"], "-" if r["rtt"] is None else f"{r['rtt']:g}", r["config"],
                      f"{r['ttft']:.2f}", f"{r['ttft_x_g']:.2f}" if g else "",
                      f"{r['total']:.1f}", str(r["tokens"]), f"{speed:.2f}",
                      f"{r['prefill']:.2f}", "" if r["ready"] is None else f"{r['ready']:.2f}",
                      str(r["warm"]), "" if r["switch"] is None else f"{r['switch']:.1f}",
                      "yes" if r["opens_as_g"] else "",
                      "" if r["rougeL"] is None else f"{100 * r['rougeL']:.1f}")
    console.print(table)
    console.print(json.dumps(extra, indent=1))
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config and r["ttft_x_g"] is not None]
        if mine:
            console.print(
                f"{config}: TTFT x G mean {statistics.mean(r['ttft_x_g'] for r in mine):.2f} "
                f"(max {max(r['ttft_x_g'] for r in mine):.2f}), speed x G mean "
                f"{statistics.mean(r['speed_x_g'] for r in mine):.2f}, opens as G "
                f"{sum(r['opens_as_g'] for r in mine)}/{len(mine)}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "extra": extra}, indent=1))


if __name__ == "__main__":
    main()
