"""The Specialist's prefill and decode rates per precision, thread count and runtime, against
the CPU's multiply-add limit measured in the same run.

The prompt is a real user's private prompt (newsgroups email, the task's budget). Per thread
count (the process pinned to that many cores) and precision, each configuration runs
`--repeats` times and keeps its best run (the machine is shared: the best run is the least
disturbed one):
  * device, last row: the device's runtime as a Client runs it (`load_device_model`): passes
    of `--chunks` tokens that compute the output layer for their last position only, then 32
    single-token steps over the prompt (the drafting a device does), its KV cache in place;
  * device, every row: the same passes computing the output layer for every position, as the
    device's prefill did before (`logits_to_keep` 0), so "x before" is measured in this run;
  * GenAI: ONNX Runtime GenAI (`load_model`), 128-token passes and 32 steps.
Multiply-adds are counted from the compiled graph itself: every linear layer's K x N per
token, the output layer's only for the rows a pass computes, plus attention over the prompt
so far (scores and weighted sum, 2 x layers x hidden x position).

The limit: `bench/mac_peak.c` (compiled here with the system's C compiler) runs independent
AVX-512 multiply-adds in registers on the same cores, right before and after each thread
count's runs: `VPDPBUSD` (int8 x int8, what w8a8's `MatMulInteger` runs on) and `VFMADD` fp32.
One linear layer's shape (128 x 896 x 4864) is also timed alone per kernel, to tell which of
the two limits each precision's kernel works against.

    flock /tmp/specsteer-heavy.lock python bench/prefill_rate.py --precisions int8 w8a8 \
        --threads 1 2 --json rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.models.logits_rows import linear_macs
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.runtime import DeviceModel, load_device_model, load_model
from specsteer_lab.eval.data import shared_file

HERE = Path(__file__).resolve().parent
DECODE_STEPS = 32  # single-token steps after the prefill (the drafting a device does)
LAYER = (128, 896, 4864)  # M x K x N of Qwen2.5-0.5B's gate projection over 128 tokens


def graph_macs(folder: Path) -> tuple[float, float, int, int]:
    """(multiply-adds per token of every linear layer but the output layer, the output
    layer's, layers, hidden size) of a compiled folder (`logits_rows.linear_macs`)."""
    import onnx

    config = json.loads((folder / "genai_config.json").read_text())["model"]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    body, head = linear_macs(graph, int(config["vocab_size"]))
    decoder = config["decoder"]
    return body, head, int(decoder["num_hidden_layers"]), int(decoder["hidden_size"])


def prompt_macs(folder: Path, tokens: int, passes: int, last_row: bool) -> float:
    """Multiply-adds of a prefill of `tokens` in `passes` passes."""
    body, head, layers, hidden = graph_macs(folder)
    attention = 2 * layers * hidden * tokens * (tokens - 1) / 2
    return tokens * body + (passes if last_row else tokens) * head + attention


class Clocks:
    """Wall-clock and CPU seconds since it was made (CPU: every thread of this process, per
    thread of the model: what the cores did while the process had them)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, count: float) -> tuple[float, float]:
        """`count` per wall-clock second and per CPU second of one of the model's threads."""
        wall = time.perf_counter() - self.wall
        cpu = (time.process_time() - self.cpu) / self.threads
        return count / wall, count / cpu


def rates(model, ids: list[int], chunk: int, last_row: bool | None, repeats: int
          ) -> dict[str, float]:
    """Prompt and decode tokens per wall-clock and per CPU second, each the best of `repeats`:
    a cold prefill in `chunk`-token passes (last_row None: the model's own session API,
    GenAI), then `DECODE_STEPS` steps."""
    best = dict.fromkeys(("tok_s", "tok_s_cpu", "decode_tok_s", "decode_tok_s_cpu"), 0.0)
    threads = getattr(model, "threads", 1)
    for _ in range(repeats):
        session = model.new_session(max_length=len(ids) + DECODE_STEPS + 8)
        clocks = Clocks(threads)
        for at in range(0, len(ids), chunk):
            part = ids[at: at + chunk]
            if last_row is None:
                session.append(part)
            else:
                session.append(part, rows=1 if last_row else None)
        prefill = clocks.rates(len(ids))
        clocks = Clocks(threads)
        for token in ids[:DECODE_STEPS]:
            session.append([token])
        decode = clocks.rates(DECODE_STEPS)
        session.close()
        for key, value in zip(best, (*prefill, *decode), strict=True):
            best[key] = max(best[key], value)
    return best


def mac_peak(binary: Path | None, threads: int) -> dict[str, float]:
    """G multiply-adds/s of `mac_peak` on `threads`, best of 3 one-second runs, per kind and
    clock: `vnni`, `fma` (wall clock) and `vnni_cpu`, `fma_cpu` (per CPU second)."""
    if binary is None:
        return {}
    best: dict[str, float] = {}
    for kind in ("vnni", "fma"):
        for _ in range(3):
            out = subprocess.run([str(binary), kind, str(threads), "1"], capture_output=True,
                                 text=True, check=True)
            wall, cpu = (float(v) / 1e9 for v in out.stdout.split())
            best[kind] = max(best.get(kind, 0.0), wall)
            best[kind + "_cpu"] = max(best.get(kind + "_cpu", 0.0), cpu)
    return best


def build_mac_peak(work: Path) -> Path | None:
    """`bench/mac_peak.c` compiled for this CPU, or None (no compiler or no AVX-512 VNNI)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if compiler is None or "avx512_vnni" not in flags:
        return None
    binary = work / "mac_peak"
    subprocess.run([compiler, "-O2", "-mavx512f", "-mavx512vnni", "-pthread",
                    str(HERE / "mac_peak.c"), "-o", str(binary)], check=True)
    return binary


def kernel_rates(threads: int, repeats: int = 20) -> dict[str, float]:
    """G multiply-adds per CPU second of one linear layer (`LAYER`) per ONNX Runtime kernel
    (best of `repeats`): fp32 `MatMul`, `MatMulNBits` 8-bit as the builder emits it (accuracy
    level 4) and `MatMulInteger` u8 x s8 (w8a8)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = LAYER
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, m, k)).astype(np.float32)
    weights = {
        "MatMul fp32": ([numpy_helper.from_array(rng.normal(size=(k, n)).astype(np.float32), "w")],
                        [helper.make_node("MatMul", ["x", "w"], ["y"])], TensorProto.FLOAT, x),
        "MatMulNBits 8-bit": (
            [numpy_helper.from_array(rng.integers(0, 255, (n, k // 32, 32), np.uint8), "q"),
             numpy_helper.from_array(rng.random(n * k // 32).astype(np.float32) * 0.01, "s")],
            [helper.make_node("MatMulNBits", ["x", "q", "s"], ["y"], domain="com.microsoft",
                              K=k, N=n, bits=8, block_size=32, accuracy_level=4)],
            TensorProto.FLOAT, x),
        "MatMulInteger u8s8": (
            [numpy_helper.from_array(rng.integers(-63, 63, (k, n), np.int8), "w")],
            [helper.make_node("MatMulInteger", ["x", "w"], ["y"])], TensorProto.INT32,
            rng.integers(0, 255, (1, m, k), np.uint8)),
    }
    out = {}
    for name, (inits, nodes, y_type, feed) in weights.items():
        x_type = TensorProto.UINT8 if feed.dtype == np.uint8 else TensorProto.FLOAT
        graph = helper.make_graph(nodes, "layer",
                                  [helper.make_tensor_value_info("x", x_type, [1, m, k])],
                                  [helper.make_tensor_value_info("y", y_type, [1, m, n])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, {"x": feed})
        best = 0.0
        for _ in range(repeats):
            clocks = Clocks(threads)
            session.run(None, {"x": feed})
            best = max(best, clocks.rates(m * k * n / 1e9)[1])
        out[name] = best
    return out


class ProfiledDeviceModel(DeviceModel):
    """The device's runtime with ONNX Runtime's profiler on: time per operator type."""

    def _options(self):
        options = super()._options()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "specsteer-prefill")
        return options


def op_shares(folder: Path, ids: list[int], chunk: int, threads: int) -> dict[str, float]:
    """Share of the kernels' time per operator type in a last-row prefill of `ids`."""
    model = ProfiledDeviceModel(folder, threads=threads)
    session = model.new_session(max_length=len(ids) + 8)
    for at in range(0, len(ids), chunk):
        session.append(ids[at: at + chunk], rows=1)
    trace = Path(model._ort.end_profiling())
    times: dict[str, float] = {}
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            times[op] = times.get(op, 0.0) + event["dur"]
    trace.unlink()
    total = sum(times.values())
    return {op: t / total for op, t in sorted(times.items(), key=lambda kv: -kv[1])}


def _pin(threads: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(threads)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--precisions", nargs="+", default=["int8", "w8a8"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--chunks", type=int, nargs="+", default=[64, 128],
                    help="tokens per prefill pass of the device's runtime")
    ap.add_argument("--no-genai", action="store_true", help="skip ONNX Runtime GenAI")
    ap.add_argument("--profile", action="store_true",
                    help="also the share of time per operator type (first chunk size)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(width=170)
    shared = load_shared_user(args.data or shared_file("email"), 0, task="email")
    store = HistoryStore(memory=True)
    store.add_many(shared.records)
    spec = get_spec(args.specialist)
    precisions = [p for p in args.precisions if compiled_dir(spec, p).is_dir()]
    for p in set(args.precisions) - set(precisions):
        console.print(f"{p}: not compiled (specsteer models compile {spec.name} --precision "
                      f"{p}); skipped")
    rows: list[dict] = []
    peaks: dict[int, list[dict[str, float]]] = {}
    kernels: dict[int, dict[str, float]] = {}
    profiles: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as work:
        binary = build_mac_peak(Path(work))
        ids: list[int] | None = None
        for threads in args.threads:
            _pin(threads)
            peaks[threads] = [mac_peak(binary, threads)]
            kernels[threads] = kernel_rates(threads)
            console.print(f"{threads} threads: limit {peaks[threads][0]}, kernels "
                          f"{kernels[threads]}")
            for precision in precisions:
                folder = compiled_dir(spec, precision)
                device = load_device_model(folder, threads=threads)
                if ids is None:
                    _, prompt = Client(device, history=store).render(shared.query, task="email")
                    ids = list(prompt.private_ids)
                configs = [(f"device, last row, {c}-token passes", device, c, True)
                           for c in args.chunks]
                configs += [(f"device, every row, {c}-token passes", device, c, False)
                            for c in args.chunks]
                if not args.no_genai:
                    configs.append(("GenAI, 128-token passes",
                                    load_model(folder, threads=threads), 128, None))
                if args.profile:
                    shares = op_shares(folder, ids, args.chunks[0], threads)
                    profiles[f"{precision}, {threads} threads"] = shares
                    console.print(f"{precision}, {threads} threads, time per operator: "
                                  + ", ".join(f"{op} {100 * v:.1f} %"
                                              for op, v in shares.items() if v >= 0.005))
                for name, model, chunk, last_row in configs:
                    measured = rates(model, ids, chunk, last_row, args.repeats)
                    passes = -(-len(ids) // chunk)
                    per_token = prompt_macs(folder, len(ids), passes, bool(last_row)) / len(ids)
                    rows.append(dict(precision=precision, threads=threads, runtime=name,
                                     chunk=chunk, tokens=len(ids), **measured,
                                     gmac_s=measured["tok_s"] * per_token / 1e9,
                                     gmac_s_cpu=measured["tok_s_cpu"] * per_token / 1e9))
                    console.print(rows[-1])
            peaks[threads].append(mac_peak(binary, threads))
    _report(console, rows, peaks, kernels, args, profiles)


def _pair(wall: float, cpu: float, fmt: str = ".1f") -> str:
    """A rate per wall-clock second, with its rate per CPU second in brackets."""
    return f"{wall:{fmt}} ({cpu:{fmt}})"


def _report(console: Console, rows: list[dict], peaks: dict[int, list[dict[str, float]]],
            kernels: dict[int, dict[str, float]], args: argparse.Namespace,
            profiles: dict[str, dict[str, float]]) -> None:
    kinds = ("vnni", "fma", "vnni_cpu", "fma_cpu")
    limit = {t: {k: max(p.get(k, 0.0) for p in runs) for k in kinds} for t, runs in peaks.items()}
    table = Table(title=f"{args.specialist} prefill, {rows[0]['tokens'] if rows else 0}-token "
                        f"private prompt, best of {args.repeats}; rates per wall-clock second "
                        "(per CPU second of one thread)")
    for col in ("precision", "threads", "runtime", "prefill tok/s", "x int8 before",
                "G MAC/s", "% VNNI limit", "% fp32 FMA limit", "decode tok/s", "decode x GenAI"):
        table.add_column(col)
    for r in rows:
        before = next((b for b in rows if b["precision"] == "int8"
                       and b["threads"] == r["threads"] and b["chunk"] == r["chunk"]
                       and b["runtime"].startswith("device, every row")), None)
        genai = next((g for g in rows if g["precision"] == r["precision"]
                      and g["threads"] == r["threads"] and g["runtime"].startswith("GenAI")),
                     None)
        lim = limit[r["threads"]]
        shares = [_pair(100 * r["gmac_s"] / lim[k], 100 * r["gmac_s_cpu"] / lim[k + "_cpu"], ".0f")
                  if lim.get(k) else "" for k in ("vnni", "fma")]
        table.add_row(
            r["precision"], str(r["threads"]), r["runtime"], _pair(r["tok_s"], r["tok_s_cpu"]),
            _pair(r["tok_s"] / before["tok_s"], r["tok_s_cpu"] / before["tok_s_cpu"], ".2f")
            if before else "",
            _pair(r["gmac_s"], r["gmac_s_cpu"]), *shares,
            _pair(r["decode_tok_s"], r["decode_tok_s_cpu"]),
            _pair(r["decode_tok_s"] / genai["decode_tok_s"],
                  r["decode_tok_s_cpu"] / genai["decode_tok_s_cpu"], ".2f") if genai else "")
    console.print(table)
    for threads, runs in peaks.items():
        console.print(f"limit, {threads} threads (G multiply-adds/s, before / after): "
                      + ", ".join(f"{k} {runs[0].get(k, 0):.0f} / {runs[-1].get(k, 0):.0f}"
                                  for k in kinds)
                      + "; one linear layer 128x896x4864 per CPU second: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in kernels[threads].items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "limit": peaks, "kernels": kernels,
                                         "profiles": profiles}, indent=1))


if __name__ == "__main__":
    main()
