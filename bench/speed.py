"""Speed benchmark of collaborative decoding on real models, device and companion on one core each.

In one run, on the same newsgroups prompts (the sender's history as private context):
  * the Generalist alone (plain ORT greedy decoding of the public prompt, one core);
  * standard speculative decoding (Specialist + context drafting, Generalist verifying);
  * SpecSteer at gamma 1.0 / 0.5 / 0.1, and at 0.1: without pipelining, with P_S0 on the
    device, with other draft lengths K and with the adaptive K (`adaptive_k`).
Reported per configuration: decode tokens/s (first to last token: prefill excluded, reported
separately as time to first token), speed-up over the Generalist alone measured in this run,
acceptance, bytes per generated token on the wire, and the share of pipelined rounds.
The analytical ceiling comes from per-step costs measured here on the device's core, after each
user's runs and at the contexts a round sees (a draft step after the private prompt, scoring
K+1 tokens after the public one), averaged over users:
  round = K*t_draft + t_score_G(K+1) + t_score_S0(K+1), tokens/round = mean accepted + 1;
  pipelined: a won bet (measured rate) hides the draft behind the verification.

    python bench/speed.py --users 2 --max-new-tokens 64 --json bench-speed.json
    python bench/speed.py --users 4 --repeat 2 --precision w8a8 --only "specsteer g=0.1" \
        "preset fast"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from specsteer.client import Client
from specsteer.device import PRESETS
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_model
from specsteer_companion.process import start_companion
from specsteer_lab.eval.data import shared_file

DEVICE_CORE, COMPANION_CORE = 0, 1


@dataclass
class Row:
    config: str
    decode_tok_s: float
    speedup: float
    acceptance: float
    bytes_per_token: float
    ttft_s: float
    tokens: int
    pipelined_share: float
    deflate_bytes_per_token: float = 0.0
    ceiling_speedup: float | None = None
    of_ceiling: float | None = None


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > core:
        os.sched_setaffinity(0, {core})


def timed_stream(client: Client, query: dict, task: str, **params) -> tuple[list[float], object]:
    """Token arrival times (seconds from the call) and the Result."""
    stamps: list[float] = []
    started = time.perf_counter()
    # decode speed of the method itself: no warm start (bench/latency.py measures that)
    stream = client.stream(query, task=task, warm_start=False, **params)
    for _ in stream:
        stamps.append(time.perf_counter() - started)
    return stamps, stream.result


def deflated_size(frames: list[tuple[str, bytes]]) -> int:
    """Bytes the frames would take under websocket permessage-deflate (context takeover):
    one raw-deflate stream per direction, each message sync-flushed, minus the 4-byte tail."""
    total = 0
    streams = {d: zlib.compressobj(6, zlib.DEFLATED, -15) for d in ("up", "down")}
    for direction, frame in frames:
        out = streams[direction].compress(frame) + streams[direction].flush(zlib.Z_SYNC_FLUSH)
        total += len(out) - 4
    return total


def decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


def generalist_alone(model, prompt_ids: list[int], max_new: int) -> tuple[float, float]:
    """Plain greedy ORT decoding: (decode tok/s, time to first token)."""
    session = model.new_session(max_length=len(prompt_ids) + max_new + 8)
    started = time.perf_counter()
    row = session.append(prompt_ids)[-1]
    stamps = []
    for _ in range(max_new):
        token = int(np.argmax(row))
        stamps.append(time.perf_counter() - started)
        if token in model.tokenizer.eos_ids:
            break
        row = session.append([token])[-1]
    session.close()
    return decode_rate(stamps), stamps[0]


def step_cost(model, context: list[int], k: int, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of one decode step and of scoring k+1 tokens after `context`, this core."""
    session = model.new_session(max_length=len(context) + 64)
    session.append(context)
    step, score = [], []
    for i in range(repeats):
        t = time.perf_counter()
        session.append([context[i]])
        step.append(time.perf_counter() - t)
        base = session.length
        t = time.perf_counter()
        session.append(context[: k + 1])
        score.append(time.perf_counter() - t)
        session.rewind(base)
    session.close()
    return statistics.median(step), statistics.median(score)


def step_costs(specialist, generalist, private: list[int], public: list[int], k: int) -> dict:
    """The costs the ceiling needs, each at the context it has in a real round: drafting after
    the private prompt, P_S0 and the Generalist scoring after the public one."""
    step_s, _ = step_cost(specialist, private, k)
    _, score_s = step_cost(specialist, public, k)
    step_g, score_g = step_cost(generalist, public, k)
    return dict(step_S=step_s, score_S=score_s, step_G=step_g, score_G=score_g)


def ceiling(costs: dict, k: int, accepted_per_round: float, bet_won: float, s0: bool) -> float:
    """Analytical tokens/s of SpecSteer from measured per-step costs (no overheads)."""
    draft = k * costs["step_S"]
    verify = costs["score_G"] + costs["score_S"]  # P_S0 is the Specialist's pass, either side
    serial = draft + verify
    overlapped = max(
        draft + (costs["score_S"] if s0 else 0.0),
        costs["score_G"] + (0.0 if s0 else costs["score_S"]),
    )
    per_round = bet_won * overlapped + (1 - bet_won) * serial
    return (accepted_per_round + 1) / per_round


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--generalist", default="qwen2.5-1.5b")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--specialist-precision", help="the Specialist's, if not --precision's")
    ap.add_argument("--only", nargs="+", metavar="CONFIG",
                    help="run only these configurations (names as in the table)")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every configuration this many times per user, interleaved (less "
                         "machine noise in the means)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--data", type=Path, help="default: the shared newsgroups set")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.data = args.data or shared_file("email")
    console = Console(width=160)
    _pin(DEVICE_CORE)
    s_precision = args.specialist_precision or args.precision
    specialist = load_model(args.specialist, precision=s_precision)
    generalist = load_model(args.generalist, precision=args.precision)
    configs: dict[str, dict] = {
        "speculative": dict(method="speculative"),
        "specsteer g=1.0": dict(gamma=1.0),
        "specsteer g=0.5": dict(gamma=0.5),
        "specsteer g=0.1": dict(gamma=0.1),
        "specsteer g=0.1 no pipeline": dict(gamma=0.1, pipeline=False),
        "specsteer g=0.1 P_S0 on device": dict(gamma=0.1, s0_on_device=True),
        "specsteer g=0.1 P_S0 on device, top_p=0.9": dict(
            gamma=0.1, s0_on_device=True, top_p=0.9
        ),
        "specsteer g=0.1 K=2": dict(gamma=0.1, k=2),
        "specsteer g=0.1 K=3": dict(gamma=0.1, k=3),
        "specsteer g=0.1 K=6": dict(gamma=0.1, k=6),
        "specsteer g=0.1 adaptive K": dict(gamma=0.1, adaptive_k=True),
        "specsteer g=0.1 adaptive K, P_S0 on device": dict(
            gamma=0.1, adaptive_k=True, s0_on_device=True
        ),
        "specsteer g=0.1 top_p=0.9": dict(gamma=0.1, top_p=0.9),
        "specsteer g=0.1 top_k=32": dict(gamma=0.1, top_k=32),
        "specsteer g=0.1 top_k=16": dict(gamma=0.1, top_k=16),
        "preset fast": dict(PRESETS["fast"]),
    }
    if args.only:
        unknown = set(args.only) - set(configs)
        if unknown:
            raise SystemExit(f"unknown configurations {sorted(unknown)}; known: {list(configs)}")
        configs = {name: configs[name] for name in args.only}
    # the companion's P_S0 is the very artifact the device runs: pass its folder
    proc, url = start_companion(
        args.generalist, str(specialist.folder), args.precision, core=COMPANION_CORE
    )
    results: dict[str, list] = {name: [] for name in ["generalist alone", *configs]}
    frames: list[tuple[str, bytes]] = []  # every frame of the current generation
    measured: dict[int, list[dict]] = defaultdict(list)  # per-step costs, per K, per user
    try:
        for user in range(args.users):
            shared = load_shared_user(args.data, user)
            store = HistoryStore(memory=True)
            store.add_many(shared.records)
            client = Client(
                specialist, history=store, companion=url, max_prompt_tokens=args.max_prompt_tokens,
                tap=lambda d, f: frames.append((d, f)),
            )
            _, device_prompt = client.render(shared.query, task=shared.task)
            for _ in range(args.repeat):
                rate, ttft = generalist_alone(
                    generalist, list(device_prompt.public_ids), args.max_new_tokens
                )
                results["generalist alone"].append(
                    dict(
                        rate=rate,
                        ttft=ttft,
                        tokens=args.max_new_tokens,
                        acc=0.0,
                        bpt=0.0,
                        dbpt=0.0,
                        piped=0.0,
                        apr=0.0,
                        k=0,
                    )
                )
                console.print(
                    f"user {user}: generalist alone {rate:.2f} tok/s "
                    f"(private prompt {len(device_prompt.private_ids)} tokens)"
                )
                for name, params in configs.items():
                    frames.clear()
                    stamps, result = timed_stream(
                        client, shared.query, shared.task,
                        max_new_tokens=args.max_new_tokens, **params,
                    )
                    st = result.stats
                    rounds = max(st.rounds, 1)
                    results[name].append(
                        dict(
                            rate=decode_rate(stamps),
                            ttft=stamps[0] if stamps else 0.0,
                            tokens=st.tokens,
                            acc=st.acceptance_rate,
                            bpt=st.bytes_per_token,
                            dbpt=deflated_size(frames) / max(st.tokens, 1),
                            piped=st.pipelined / rounds,
                            apr=st.accepted / rounds,
                            k=0 if params.get("adaptive_k") else params.get("k", 4),
                            s0=bool(params.get("s0_on_device")),  # None: the companion's
                            specsteer=params.get("method", "specsteer") == "specsteer",
                            text=result.text,
                        )
                    )
                    console.print(
                        f"  {name}: {decode_rate(stamps):.2f} tok/s, acceptance "
                        f"{st.acceptance_rate:.0%}, {st.bytes_per_token:.1f} B/token"
                    )
            for k in {p.get("k", 4) for p in configs.values()} | {4}:  # this user's contexts
                measured[k].append(step_costs(
                    specialist, generalist, list(device_prompt.private_ids),
                    list(device_prompt.public_ids), k,
                ))
        costs_by_k = {k: {name: statistics.mean(c[name] for c in runs) for name in runs[0]}
                      for k, runs in measured.items()}
        costs = costs_by_k[4]
    finally:
        proc.terminate()
        proc.wait(10)
    base = statistics.mean(r["rate"] for r in results["generalist alone"])
    rows = []
    for name, runs in results.items():
        rate = statistics.mean(r["rate"] for r in runs)
        row = Row(
            name,
            rate,
            rate / base,
            statistics.mean(r["acc"] for r in runs),
            statistics.mean(r["bpt"] for r in runs),
            statistics.mean(r["ttft"] for r in runs),
            sum(r["tokens"] for r in runs),
            statistics.mean(r["piped"] for r in runs),
            statistics.mean(r["dbpt"] for r in runs),
        )
        if runs[0].get("specsteer") and runs[0]["k"]:  # no ceiling for an adaptive K
            k = runs[0]["k"]
            c = costs_by_k[k]
            apr = statistics.mean(r["apr"] for r in runs)
            piped = row.pipelined_share
            row.ceiling_speedup = (
                ceiling(c, k, apr, piped, runs[0].get("s0", False)) * costs["step_G"]
            )
            row.of_ceiling = row.speedup / row.ceiling_speedup
        rows.append(row)
    table = Table(
        title=f"{args.specialist} ({s_precision}) -> {args.generalist} ({args.precision}), "
        f"{args.users} users x {args.max_new_tokens} tokens, 1 core each"
    )
    for col in [
        "config",
        "decode tok/s",
        "speed-up",
        "acceptance",
        "B/token",
        "deflate B/token",
        "TTFT s",
        "pipelined",
        "ceiling",
        "of ceiling",
    ]:
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.config,
            f"{r.decode_tok_s:.2f}",
            f"{r.speedup:.2f}x",
            f"{r.acceptance:.0%}",
            f"{r.bytes_per_token:.1f}",
            f"{r.deflate_bytes_per_token:.1f}",
            f"{r.ttft_s:.1f}",
            f"{r.pipelined_share:.0%}",
            f"{r.ceiling_speedup:.2f}x" if r.ceiling_speedup else "-",
            f"{r.of_ceiling:.0%}" if r.of_ceiling else "-",
        )
    console.print(table)
    console.print({k: f"{v * 1e3:.1f} ms" for k, v in costs.items()})
    reference = results.get("specsteer g=0.1")
    for name, runs in results.items():  # does a smaller candidate set change the text?
        if reference and ("top_" in name or name.startswith("preset")):
            same = sum(r["text"] == ref["text"] for r, ref in zip(runs, reference, strict=True))
            console.print(f"{name}: same text as 'specsteer g=0.1' for {same}/{len(runs)} users")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.platform(),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "costs_s": costs,
                    "rows": [asdict(r) for r in rows],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
