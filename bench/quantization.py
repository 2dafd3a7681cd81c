"""Quality and verify cost of one compiled precision against another, on newsgroups text.

Teacher-forces the first `--positions` tokens of each of the first `--users` shared newsgroups
senders' records (JSON text) through both folders in one multi-token append and reports top-1
agreement and mean KL(reference || candidate) over all those positions (and the range over
senders); then times one decode step and a 5-token scoring pass of each on one core (300-token
context, the first sender's).

    python bench/quantization.py qwen2.5-1.5b --reference int8 --candidate w8a8
    python bench/quantization.py qwen2.5-0.5b --reference fp32 --candidate w8a8 --users 20
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


def teacher_forced(model, ids: list[int]) -> np.ndarray:
    """The logits of every position of `ids`, in one multi-token append."""
    session = model.new_session(max_length=len(ids) + 16)
    try:
        return session.append(ids)
    finally:
        session.close()


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
    ap.add_argument("--users", type=int, default=1, help="senders whose records are read")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    data = json.loads(shared_file("email").read_text())
    records = data if isinstance(data, list) else list(data.values())
    ref = load_model(args.model, precision=args.reference)
    texts = [ref.tokenizer.encode(json.dumps(r)[:4000])[: args.positions]
             for r in records[: args.users]]
    models = {args.reference: ref, args.candidate: load_model(args.model, precision=args.candidate)}
    for name, model in models.items():
        step, score = costs(model, texts[0])
        print(f"{args.model} {name}: step {step * 1e3:.0f} ms, 5-token scoring "
              f"{score * 1e3:.0f} ms ({score / step:.2f} steps)")
    top1s, kls = [], []  # per sender, compared at once: all rows would not fit in memory
    for ids in texts:
        a, b = (log_softmax(teacher_forced(m, ids)) for m in models.values())
        top1s.append(a.argmax(-1) == b.argmax(-1))
        kls.append((np.exp(a) * (a - b)).sum(-1))
    top1, kl = float(np.concatenate(top1s).mean()), float(np.concatenate(kls).mean())
    print(f"{args.candidate} vs {args.reference} over {sum(map(len, texts))} positions of "
          f"{len(texts)} senders: top-1 {top1:.1%}, KL {kl:.4f} (per sender: top-1 "
          f"{min(map(np.mean, top1s)):.1%}–{max(map(np.mean, top1s)):.1%}, KL "
          f"{min(map(np.mean, kls)):.4f}–{max(map(np.mean, kls)):.4f})")


if __name__ == "__main__":
    main()
