"""Prefill chunk size against throughput, and how fast a cancel stops a prefill (real model).

A cancel waits for the prefill pass in flight, so the device sizes its passes by time
(`PrefillPace`, ~`PACED_CHUNK_S` each) instead of a fixed token count. Small passes cost
throughput; this measures that cost on the private prompt of real users (fixed chunk sizes
and the paced prefill, tokens/s), then cancels generations at spread-out moments of their
prefill through `Client.stream` and records how long each took to end after the cancel.

    flock /tmp/specsteer-heavy.lock python bench/prefill_pace.py --users 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from latency import cancel_stop_s  # bench/, the script's own folder
from rich.console import Console
from rich.table import Table

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_model
from specsteer.runtime.track import PACED_CHUNK_S, PrefillPace, Track
from specsteer_lab.eval.data import shared_file

CHUNKS = (8, 12, 16, 24, 32, 64, 128)


class TimedSession:
    """The real session, recording how long each pass took."""

    def __init__(self, session) -> None:
        self.inner, self.passes = session, []

    @property
    def length(self) -> int:
        return self.inner.length

    def append(self, ids):
        started = time.perf_counter()
        rows = self.inner.append(ids)
        self.passes.append((len(ids), time.perf_counter() - started))
        return rows

    def rewind(self, length: int) -> None:
        self.inner.rewind(length)

    def close(self) -> None:
        self.inner.close()


def prefill(model, ids: list[int], chunk: int | None) -> dict:
    """One cold prefill of `ids`, `chunk` tokens per pass (None: paced from a fresh pace)."""
    pace = PrefillPace() if chunk is None else None
    track = Track(model, ids, len(ids) + 8, lazy=True, chunk=chunk or 128, pace=pace)
    track.session = timed = TimedSession(track.session)
    started = time.perf_counter()
    track.prefill()
    seconds = time.perf_counter() - started
    track.close()
    return {"chunk": "paced" if chunk is None else chunk, "tok_s": len(ids) / seconds,
            "seconds": seconds, "passes": len(timed.passes),
            "max_pass_s": max(s for _, s in timed.passes),
            "median_tokens": statistics.median(n for n, _ in timed.passes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--users", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cancels", type=int, default=6, help="cancelled generations per user")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(args.threads)))
    model = load_model(args.specialist, precision=args.precision, threads=args.threads)
    data = args.data or shared_file("email")
    console = Console(width=150)
    rows, cancels = [], []
    for user in range(args.users):
        shared = load_shared_user(data, user, task="email")
        store = HistoryStore(memory=True)
        store.add_many(shared.records)

        def client(store: HistoryStore = store) -> Client:
            return Client(model, history=store, max_prompt_tokens=args.max_prompt_tokens)

        ids = client().render(shared.query, task="email")[1].private_ids
        prefill(model, ids[:64], 64)  # warm the runtime up once
        for chunk in (*CHUNKS, None):
            rows.append({"user": user, "tokens": len(ids), **prefill(model, ids, chunk)})
            console.print(rows[-1])
        for i in range(args.cancels):  # cancel moments spread over the first seconds
            delay = 0.3 + i * 0.53
            cancels.append({"user": user, "delay_s": delay, "stop_s": cancel_stop_s(
                client(), shared.query, delay, method="slm_rag", max_new_tokens=4)})
            console.print(cancels[-1])
    table = Table(title=f"{args.specialist} {args.precision} prefill, {args.threads} thread(s), "
                        f"paced target {PACED_CHUNK_S:g} s per pass")
    for col in ("user", "prompt tokens", "chunk", "tokens/s", "x 128-token chunks", "passes",
                "median tokens/pass", "longest pass s"):
        table.add_column(col)
    for r in rows:
        base = next(b for b in rows if b["user"] == r["user"] and b["chunk"] == 128)
        table.add_row(str(r["user"]), str(r["tokens"]), str(r["chunk"]), f"{r['tok_s']:.1f}",
                      f"{r['tok_s'] / base['tok_s']:.2f}", str(r["passes"]),
                      f"{r['median_tokens']:g}", f"{r['max_pass_s']:.3f}")
    console.print(table)
    stops = [c["stop_s"] for c in cancels if c["stop_s"] is not None]
    if stops:
        console.print(f"cancel during the prefill: {len(stops)} of {len(cancels)} cancels landed; "
                      f"stop after median {statistics.median(stops) * 1000:.0f} ms, "
                      f"max {max(stops) * 1000:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps({"prefill": rows, "cancels": cancels}, indent=1))


if __name__ == "__main__":
    main()
