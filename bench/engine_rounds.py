"""A round's cost against the session's length, on the vLLM engine and on ONNX Runtime.

Sessions are opened over public prompts of each `--contexts` length (real text: the persona's
sent mail, repeated as needed, so the tokens are ordinary prose) and run `--rounds` rounds of
K drafted ids each (the Specialist's own greedy continuation is not needed: the verify pass
costs the same for any ids), keeping 2 of each draft plus one token as a typical round does.
Reported per engine and length: the median round time, and for vLLM the share of each
round's prompt tokens its prefix cache served (after the first round) and the most tokens a
round recomputed. The target: a round at 2,000 context tokens within 1.3x of one at 200.

`--sessions N [N ...]` measures instead what many devices cost the engine alone (no
websockets, no P_S0): N sessions at once, one thread each, each with its own owner (so its
own prefix-cache salt) and prompt of `--contexts`' first length, opened together and then
running `--rounds` rounds; reported per N: the open p50, round p50/p99 and the engine's scored
tokens per second.

    flock /tmp/specsteer-heavy.lock python bench/engine_rounds.py --contexts 200 2000 \\
        --rounds 12 --json /tmp/engine-rounds.json
    flock /tmp/specsteer-heavy.lock python bench/engine_rounds.py --dtype float32 \\
        --sessions 1 16 --contexts 60 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
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


def rounds(engine, prompt: list[int], count: int, k: int, fresh: list[int],
           owner: str = "bench") -> dict:
    started = time.perf_counter()
    session = engine.open(prompt, max_length=len(prompt) + 8 * count * (k + 1) + 8,
                          temperature=1.0, owner=owner)
    opened_ms = 1e3 * (time.perf_counter() - started)
    times = []
    for r in range(count):
        draft = fresh[r * k:(r + 1) * k]
        committed = [fresh[-1 - r]] if r else []
        started = time.perf_counter()
        session.score([*committed, *draft], len(committed), 64)
        times.append(time.perf_counter() - started)
        session.keep(len(committed) + 2)
    out = {"round_ms": [1e3 * t for t in times], "open_ms": opened_ms}
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
    parser.add_argument("--dtype", default="bfloat16", help="the export-hf folder's (w8a8: int8)")
    parser.add_argument("--compile", action="store_true",
                        help="let vLLM torch.compile the model (fuses the int8 quantization)")
    parser.add_argument("--precision", default="int8", help="the ONNX Runtime Generalist's")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--cpus", default=None, help="vLLM's cores (VLLM_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--fcfs", action="store_true",
                        help="first come first served (default: rounds before openings)")
    parser.add_argument("--max-batched-tokens", type=int, default=None,
                        help="vLLM's tokens per step (serve --engine-max-batched-tokens)")
    parser.add_argument("--long-prefill", type=int, default=None,
                        help="an opening's most tokens per step (serve --engine-long-prefill)")
    parser.add_argument("--sessions", type=int, nargs="+",
                        help="N concurrent sessions on the vLLM engine alone (see above)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.sessions:
        return concurrent(args)

    ort = TrackScoring(load_model(compile_model("qwen2.5-1.5b", args.precision), threads=1))
    engine = vllm_engine(args)
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


def vllm_engine(args: argparse.Namespace) -> VllmScoring:
    """The 1.5B on vLLM at `--dtype`, sized and bound as the options say."""
    return VllmScoring(VllmOptions(model=str(hf_dir("qwen2.5-1.5b", args.dtype)),
                                   dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                                   cpus=args.cpus, eager=not args.compile,
                                   rounds_first=not args.fcfs,
                                   max_num_batched_tokens=args.max_batched_tokens,
                                   long_prefill=args.long_prefill))


def sessions_at_once(engine: VllmScoring, ids: list[int], n: int,
                     args: argparse.Namespace) -> dict:
    """N sessions opened and run together, each its own device (owner) and prompt."""
    length = args.contexts[0]
    got: list[dict] = []
    lock = threading.Lock()

    def device(i: int) -> None:
        start = (i % 64) * length  # a prompt of its own
        one = rounds(engine, ids[start:start + length], args.rounds, args.k, ids[-400:],
                     owner=f"device-{n}-{i}")
        with lock:
            got.append(one)

    began = time.perf_counter()
    threads = [threading.Thread(target=device, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    times = sorted(t for one in got for t in one["round_ms"])
    return {"sessions": n, "context": length, "wall_s": wall,
            "open_p50_ms": statistics.median(one["open_ms"] for one in got),
            "round_p50_ms": statistics.median(times),
            "round_p99_ms": times[max(0, (99 * len(times) + 99) // 100 - 1)],  # nearest rank
            "scored_tokens_per_s": len(times) * (args.k + 1) / wall}


def concurrent(args: argparse.Namespace) -> None:
    """`--sessions`: each N of them at once on one engine (see the docstring)."""
    engine = vllm_engine(args)
    results = []
    try:
        ids = prose_ids(engine.tokenizer, 64 * args.contexts[0] + 400)
        rounds(engine, ids[:64], 2, args.k, ids[-400:], owner="warm")  # warm the code paths
        for n in args.sessions:
            results.append(sessions_at_once(engine, ids, n, args))
            print(json.dumps(results[-1]), flush=True)
    finally:
        engine.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
