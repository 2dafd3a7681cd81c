"""A round's cost against the session's length, on the vLLM engine and on ONNX Runtime.

Sessions are opened over public prompts of each `--contexts` length (real text: the persona's
sent mail, repeated as needed, so the tokens are ordinary prose) and run `--rounds` rounds of
K drafted ids each (the Specialist's own greedy continuation is not needed: the verify pass
costs the same for any ids), keeping 2 of each draft plus one token as a typical round does.
Reported per engine and length: the median round time, and for vLLM the share of each
round's prompt tokens its prefix cache served (after the first round) and the most tokens a
round recomputed. The target: a round at 2,000 context tokens within 1.3x of one at 200.

    flock /tmp/specsteer-heavy.lock python bench/engine_rounds.py --contexts 200 2000 \\
        --rounds 12 --json /tmp/engine-rounds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specsteer.models.compile import compile_model
from specsteer.models.export_hf import hf_dir
from specsteer.runtime import load_model
from specsteer_companion.scoring import TrackScoring
from specsteer_companion.vllm_engine import VllmOptions, VllmScoring

PERSONA = Path(__file__).parents[1] / "sample_apps" / "data"


def prose_ids(tokenizer, length: int) -> list[int]:
    """`length` token ids of real prose (the persona's files, repeated)."""
    text = " ".join(p.read_text() for p in sorted(PERSONA.rglob("*")) if p.is_file()
                    and p.suffix in (".md", ".txt", ".json", ".mbox", ".eml"))
    ids = tokenizer.encode(text)
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


def rounds(engine, prompt: list[int], count: int, k: int, fresh: list[int]) -> dict:
    session = engine.open(prompt, max_length=len(prompt) + 8 * count * (k + 1) + 8,
                          temperature=1.0, owner="bench")
    times = []
    for r in range(count):
        draft = fresh[r * k:(r + 1) * k]
        committed = [fresh[-1 - r]] if r else []
        started = time.perf_counter()
        session.score([*committed, *draft], len(committed), 64)
        times.append(time.perf_counter() - started)
        session.keep(len(committed) + 2)
    out = {"round_ms": [1e3 * t for t in times]}
    if hasattr(session, "rounds"):
        later = session.rounds[1:]
        out["cached_share"] = sum(c for _, c in later) / max(sum(t for t, _ in later), 1)
        out["most_recomputed"] = max(t - c for t, c in later)
    session.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--precision", default="int8", help="the ONNX Runtime Generalist's")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--cpus", default=None, help="vLLM's cores (VLLM_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    ort = TrackScoring(load_model(compile_model("qwen2.5-1.5b", args.precision), threads=1))
    engine = VllmScoring(VllmOptions(model=str(hf_dir("qwen2.5-1.5b", args.dtype)),
                                     dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                                     cpus=args.cpus))
    tokenizer = ort.tokenizer
    results = []
    try:
        for length in args.contexts:
            ids = prose_ids(tokenizer, length + 400)
            prompt, fresh = ids[:length], ids[length:]
            for name, scoring in (("onnx", ort), ("vllm", engine)):
                rounds(scoring, prompt[:64], 2, args.k, fresh)  # warm the code paths
                got = rounds(scoring, prompt, args.rounds, args.k, fresh)
                row = {"engine": name, "context": length,
                       "round_p50_ms": statistics.median(got["round_ms"][1:]), **got}
                results.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "round_ms"}), flush=True)
    finally:
        engine.close()
    for name in ("onnx", "vllm"):
        mine = {r["context"]: r["round_p50_ms"] for r in results if r["engine"] == name}
        low, high = min(mine), max(mine)
        print(f"{name}: round p50 {mine[low]:.0f} ms at {low} tokens, {mine[high]:.0f} ms at "
              f"{high}: {mine[high] / mine[low]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
