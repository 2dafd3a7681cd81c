"""Quality and verify cost of one compiled precision against another, on newsgroups text.

Teacher-forces the first `--positions` tokens of a shared newsgroups sender's record (JSON
text) through both folders in one multi-token append and reports top-1 agreement and mean
KL(reference || candidate); then times one decode step and a 5-token scoring pass of each on
one core (300-token context).

    python bench/quantization.py qwen2.5-1.5b --reference int8 --candidate w8a8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from specsteer.runtime import load_model
from specsteer_lab.eval.data import shared_file


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def costs(model, ids: list[int], repeats: int = 5) -> tuple[float, float]:
    """Median seconds of a 1-token step and of scoring 5 tokens after `ids[:300]`."""
    session = model.new_session(max_length=len(ids) + 16)
    session.append(ids[:300])
    out = []
    for k in (1, 5):
        times = []
        for i in range(repeats):
            base = session.length
            started = time.perf_counter()
            session.append(ids[i : i + k])
            times.append(time.perf_counter() - started)
            session.rewind(base)
        out.append(statistics.median(times))
    session.close()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--reference", default="int8")
    ap.add_argument("--candidate", default="w8a8")
    ap.add_argument("--positions", type=int, default=400)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    data = json.loads(shared_file("email").read_text())
    first = data[0] if isinstance(data, list) else data[next(iter(data))]
    ref = load_model(args.model, precision=args.reference)
    ids = ref.tokenizer.encode(json.dumps(first)[:4000])[: args.positions]
    rows = {}
    for name in (args.reference, args.candidate):
        model = ref if name == args.reference else load_model(args.model, precision=name)
        session = model.new_session(max_length=len(ids) + 16)
        rows[name] = log_softmax(session.append(ids))
        session.close()
        step, score = costs(model, ids)
        print(f"{args.model} {name}: step {step * 1e3:.0f} ms, 5-token scoring "
              f"{score * 1e3:.0f} ms ({score / step:.2f} steps)")
    a, b = rows[args.reference], rows[args.candidate]
    top1 = float((a.argmax(-1) == b.argmax(-1)).mean())
    kl = float((np.exp(a) * (a - b)).sum(-1).mean())
    print(f"{args.candidate} vs {args.reference} over {len(ids)} positions: "
          f"top-1 {top1:.1%}, KL {kl:.4f}")


if __name__ == "__main__":
    main()
