"""The Specialist's prefill rate per precision, thread count and runtime, against the CPU's
arithmetic limit.

The prompt is a real user's private prompt (newsgroups email, the task's budget), prefilled
in 128-token passes, then 32 single-token steps (the device's drafting). Each configuration
is measured `--repeats` times and the best run is kept: the machine is shared, and the best
run is the least disturbed one. Multiply-adds per token are the model's parameters (the tied
embedding table is a lookup on the way in but the output layer's matrix on the way out, so it
counts once) plus attention over the prompt so far (scores and weighted sum). The CPU's
arithmetic limit to compare with is an estimate, written in docs/BENCHMARKS.md with its
reasoning; this script measures rates only.

    flock /tmp/specsteer-heavy.lock python bench/prefill_rate.py --precisions int8 w8a8 int4 \
        --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.runtime import load_device_model, load_model
from specsteer.runtime.track import Track
from specsteer_lab.eval.data import shared_file

# Qwen2.5-0.5B (model card / config): 494 M parameters (the 151,936 x 896 embedding table
# tied with the output layer among them); 24 layers, 14 query heads of 64 = 896.
PARAMS, LAYERS, HIDDEN = 494e6, 24, 896


def macs_per_token(position: int) -> float:
    """Multiply-adds for one prompt token at `position`: a multiply-add per parameter and,
    per layer, scores and weighted sum over the `position` tokens before it."""
    return PARAMS + 2 * LAYERS * HIDDEN * position


DECODE_STEPS = 32  # single-token steps after the prefill (the drafting a device does)


def best_rates(model, ids: list[int], repeats: int) -> tuple[float, float]:
    """(prompt tokens/s, decode tokens/s), each the best of `repeats` runs: a cold prefill in
    128-token passes, then `DECODE_STEPS` single-token steps over the prefilled prompt."""
    prefill = decode = 0.0
    for _ in range(repeats):
        track = Track(model, ids, len(ids) + DECODE_STEPS + 8, lazy=True)
        started = time.perf_counter()
        track.prefill()
        prefill = max(prefill, len(ids) / (time.perf_counter() - started))
        started = time.perf_counter()
        for token in ids[:DECODE_STEPS]:
            track.push(token)
        decode = max(decode, DECODE_STEPS / (time.perf_counter() - started))
        track.close()
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--precisions", nargs="+", default=["int8", "w8a8", "int4"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runtimes", nargs="+", choices=("device", "genai"),
                    default=["device", "genai"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(width=150)
    shared = load_shared_user(args.data or shared_file("email"), 0, task="email")
    store = HistoryStore(memory=True)
    store.add_many(shared.records)
    rows = []
    ids: list[int] | None = None
    for precision in args.precisions:
        if not compiled_dir(get_spec(args.specialist), precision).is_dir():
            console.print(f"{precision}: not compiled (specsteer models compile "
                          f"{args.specialist} --precision {precision}); skipped")
            continue
        for threads in args.threads:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, set(range(threads)))
            for runtime in args.runtimes:
                loader = load_device_model if runtime == "device" else load_model
                model = loader(args.specialist, precision=precision, threads=threads)
                if ids is None:
                    _, prompt = Client(model, history=store).render(shared.query, task="email")
                    ids = list(prompt.private_ids)
                rate, decode = best_rates(model, ids, args.repeats)
                macs = sum(macs_per_token(p) for p in range(len(ids))) / len(ids)
                rows.append(dict(precision=precision, threads=threads, runtime=runtime,
                                 tokens=len(ids), tok_s=rate, gmac_s=rate * macs / 1e9,
                                 decode_tok_s=decode))
                console.print(rows[-1])
                del model
    table = Table(title=f"{args.specialist} prefill, {len(ids or [])}-token private prompt, "
                        "128-token passes, best of " + str(args.repeats))
    for col in ("precision", "threads", "runtime", "prefill tokens/s", "G multiply-adds/s",
                "per thread", "decode tokens/s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["precision"], str(r["threads"]), r["runtime"], f"{r['tok_s']:.1f}",
                      f"{r['gmac_s']:.1f}", f"{r['gmac_s'] / r['threads']:.1f}",
                      f"{r['decode_tok_s']:.1f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
