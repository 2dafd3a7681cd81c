"""Scale-out benchmark: N devices against the companion on Ray Serve with 1 and 2 replicas.

Starts a private local Ray cluster, deploys the Ray Serve application (`specsteer_companion.
ray_app`, the same code `specsteer-companion ray serve` runs) with R verifier replicas of the
tiny pair (or `--generalist/--specialist` compiled folders), and for each N runs N real
`Client`s at once, each on its own thread and websocket, each generating `--generations` texts
greedily. Every text is checked against a single in-process companion's (a difference counts as
an error, as does a degraded generation). Reported per (R, N): aggregate tokens/s, p50/p95
generation seconds, sessions per replica (from the ingress's /stats), errors.

On one small machine every part shares the same cores: the devices' Specialists, the ingress,
Serve's proxy and the replicas. Read the table for the shape (where adding a replica helps, where
the machine is the limit), not for GPU numbers; docs/scale.md has the GPU deployment on paper.

    flock /tmp/specsteer-heavy.lock python bench/scale.py --replicas 1 2 --devices 1 2 4 8 16 32

`--backend ort|vllm` measures one companion process instead (no Ray), with the Generalist on
ONNX Runtime with cross-session batching (`serve --batch`) or on a vLLM engine (`serve
--generalist-engine vllm`, the `export-hf` folder of `--generalist`): the devices replay real
conversations (`bench/load.py`: one real Client records them against that companion alone,
then N simulated devices send them at once, sleeping the recorded device time between rounds,
so this box's cores go to the companion, not to N Specialists). Every reply at N devices is
checked against the one the companion gave a device alone (a difference is an error, as is a
refused or dropped request), so the texts are those of an undisturbed companion. Reported per
N: aggregate tokens/s, p50/p99 round time, companion CPU, errors.

    flock /tmp/specsteer-heavy.lock python bench/scale.py --backend ort vllm \
        --generalist qwen2.5-1.5b --specialist qwen2.5-0.5b --devices 1 4 16
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from specsteer.client import Client
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.ray_config import parse_config
from specsteer_companion.verifier import Verifier

QUERY = "Budget for next quarter"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stats(http: str) -> dict:
    with urllib.request.urlopen(f"{http}/stats", timeout=10) as reply:
        return json.loads(reply.read())


def run_round(url: str, specialist, n: int, generations: int, tokens: int,
              expected: list[int]) -> dict:
    times: list[float] = []
    produced, errors = [0], [0]
    why: collections.Counter[str] = collections.Counter()  # what each failure was
    lock = threading.Lock()

    def device() -> None:
        client = Client(specialist, companion=url, timeout_s=120)
        for _ in range(generations):
            started = time.perf_counter()
            failure = ""
            try:
                result = client.generate(QUERY, max_new_tokens=tokens, k=4, offline="fail")
                if result.tokens != expected or result.stats.degraded:
                    failure = "different text" if result.tokens != expected else "degraded"
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                failure, result = f"{type(exc).__name__}: {exc}"[:160], None
            with lock:
                times.append(time.perf_counter() - started)
                errors[0] += bool(failure)
                if failure:
                    why[failure] += 1
                produced[0] += len(result.tokens) if result is not None else 0

    threads = [threading.Thread(target=device) for _ in range(n)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    times.sort()
    return {"devices": n, "tokens_per_s": produced[0] / wall, "wall_s": wall,
            "p50_s": statistics.median(times),
            "p95_s": times[max(0, math.ceil(0.95 * len(times)) - 1)],  # nearest rank
            "errors": errors[0], "why": dict(why)}


def single_companion(args: argparse.Namespace) -> None:
    """Each `--backend` as one companion process, N replayed devices (see the docstring)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from load import process_tree, record_traces, run_level, table
    from rich.console import Console

    from specsteer_companion.process import start_companion

    console = Console(width=150)
    options = argparse.Namespace(specialist=args.specialist, precision=args.precision,
                                 method="specsteer", max_new_tokens=args.tokens)
    rows = []
    for backend in args.backend:
        sizing = shlex.split(args.engine_args) if args.engine_args else [
            "--engine-kv-cache-gib", str(args.engine_kv_cache_gib)]
        engine = ["--generalist-engine", "vllm", "--engine-dtype", args.engine_dtype, *sizing] \
            if backend == "vllm" else []
        generalist = (args.vllm_generalist or args.generalist) if backend == "vllm" \
            else args.generalist
        proc, url = start_companion(generalist, args.specialist, args.precision,
                                    specialist_precision=args.precision,  # the replays' own
                                    batch=backend == "ort", core=args.companion_core,
                                    timeout_s=1800, args=engine)
        try:
            traces = record_traces(options, url)
            levels = [run_level(url, traces, n, args.generations, True, proc.pid)
                      for n in args.devices]
        finally:  # a companion still finishing queued engine requests is not waited for
            tree = process_tree(proc.pid)  # its engine's processes too, which outlive a kill
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                for pid in tree:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait()
        tokens = sum(t.tokens for t in traces)
        wire = sum(len(step.frame) + sum(map(len, step.replies)) for t in traces
                   for step in t.steps)
        title = (f"{backend}: {args.generalist} + {args.specialist}, {args.tokens} new tokens, "
                 f"traces {tokens} tokens, {wire / tokens:.1f} B/token on the wire")
        console.print(table(levels, title))
        rows += [{"backend": backend, "bytes_per_token": wire / tokens, **vars(level)}
                 for level in levels]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    sys.exit(1 if any(row["errors"] for row in rows) else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=["ort", "vllm"],
                        help="one companion process per engine instead of Ray replicas")
    parser.add_argument("--precision", default="int8", help="ONNX Runtime models' precision")
    parser.add_argument("--engine-dtype", default="bfloat16", help="the vLLM folder's dtype")
    parser.add_argument("--engine-kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--vllm-generalist", help="the Generalist's HF folder for --backend "
                        "vllm when --generalist is a compiled folder (registry names resolve)")
    parser.add_argument("--engine-args", help="serve's --engine-* sizing options instead of "
                        "--engine-kv-cache-gib, e.g. \"--engine-gpu-memory 0.85\" on a GPU")
    parser.add_argument("--companion-core", type=int, default=None,
                        help="pin the companion (and its engine) to this core")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--generalist", default=str(tiny_model_dir("llama", seed=1)))
    parser.add_argument("--specialist", default=str(tiny_model_dir("llama", seed=0)))
    parser.add_argument("--per-address-cap", type=int, default=None,
                        help="the ingress's max_connections_per_address (default: 2 x the "
                        "most devices: every device connects from 127.0.0.1, and a device's "
                        "next connection may open before the ingress has seen its last close)")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    if args.backend:
        return single_companion(args)
    per_address = args.per_address_cap or 2 * max(args.devices)

    import ray
    from ray import serve

    from specsteer_companion import ray_app

    specialist = load_model(args.specialist)
    generalist = load_model(args.generalist)
    verifier = Verifier(generalist, specialist)
    reference = Client(specialist, companion=lambda: LocalChannel.for_verifier(verifier))
    expected = reference.generate(QUERY, max_new_tokens=args.tokens, k=4).tokens
    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             object_store_memory=200 * 2**20, namespace="specsteer", log_to_driver=False)
    rows = []
    try:
        for replicas in args.replicas:
            port = _free_port()
            config = parse_config({
                "address": "local", "open_access": True,
                "models": {"generalist": args.generalist, "specialist": args.specialist},
                "verifier": {"min_replicas": replicas, "max_replicas": replicas,
                             "num_cpus": 0.5, "max_ongoing_requests": 64, "max_sessions": 256},
                "ingress": {"port": port, "num_cpus": 0.25, "replica_timeout_s": 120,
                            "max_connections_per_address": per_address},
            })
            url = ray_app.start(config)
            http = f"http://127.0.0.1:{port}"
            for n in args.devices:
                before = _stats(http)
                row = run_round(url, specialist, n, args.generations, args.tokens, expected)
                stats = _stats(http)
                row["refused"] = stats["refused"] - before["refused"]
                before, after = before["sessions"], stats["sessions"]
                row["replicas"] = replicas
                row["sessions_per_replica"] = sorted(
                    after[r] - before.get(r, 0) for r in after if after[r] > before.get(r, 0))
                rows.append(row)
                print(f"R={replicas} N={n:>2}: {row['tokens_per_s']:7.1f} tok/s  "
                      f"p50 {row['p50_s']:5.2f} s  p95 {row['p95_s']:5.2f} s  "
                      f"sessions/replica {row['sessions_per_replica']}  "
                      f"errors {row['errors']} {row['why'] or ''} "
                      f"refused at connect {row['refused']}", flush=True)
            serve.delete(config.app_name)
            serve.shutdown()
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    sys.exit(1 if any(row["errors"] for row in rows) else 0)


if __name__ == "__main__":
    main()
