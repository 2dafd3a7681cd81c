"""Runtime benchmark: ONNX Runtime GenAI (each compiled precision) vs transformers/torch fp32.

For every model given, on one ~300-token chat context and the very same token ids:
  * decode speed: greedy, 64 tokens after the context (prefill excluded);
  * K-token scoring: appending K drafted tokens to the cached context and rewinding (K=1,4,8,16),
    which is what the Generalist does once per Draft-Verify-Recover round;
  * drift: greedy agreement (common prefix of 64 greedy tokens), top-1 agreement and mean
    KL(reference || candidate) over 64 teacher-forced positions, against ORT fp32 when it is in
    the run (else torch fp32), and always against torch fp32 too.
torch is the same weights (transformers dequantizes the registry GGUF); both run on one thread,
as on a device. The machine drifts, so torch decode is timed right before and right after the ORT
runs. Heavy: one model at a time, never alongside a compile.

    python bench/runtime.py --models smollm2-135m --precisions fp32 int8 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF de-quantization progress bar

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from specsteer.models.registry import PRECISIONS, compiled_dir, get_spec, gguf_path  # noqa: E402
from specsteer.runtime import load_model  # noqa: E402
from specsteer.tokenizer import Message, Tokenizer  # noqa: E402

NOTES = [
    "Met with Anna and the design team on Tuesday to review the onboarding flow.",
    "The new sign-up page cut the drop-off rate from 38 percent to 24 percent in two weeks.",
    "Mobile users still abandon the form at the address step; we suspect the postcode lookup.",
    "Budget for the next quarter stays flat, but we can move two contractors to the mobile team.",
    "Legal asked us to reword the consent text before the launch in Germany and Austria.",
    "Ravi will run five user interviews next week and share the recordings by Friday.",
    "The analytics dashboard double counts sessions that cross midnight; a fix is in review.",
    "Customer support reports fewer password-reset tickets since the magic-link login shipped.",
    "We agreed to freeze new features for the release candidate on the 14th.",
    "Open question: should the referral bonus be paid in credit or as a discount code?",
    "The vendor for SMS verification raised prices by twelve percent; compare two alternatives.",
    "Accessibility audit found low contrast on the secondary buttons and missing form labels.",
    "Marketing wants a short demo video of the new flow for the newsletter at month end.",
    "Server costs went down after moving image resizing to the edge, about 900 euros a month.",
]


@dataclass
class Timing:
    """Decode and scoring times of one engine on one context."""

    engine: str
    load_s: float = 0.0
    prefill_s: float = 0.0
    decode_tok_s: float = 0.0
    decode_cpu_tok_s: float = 0.0
    score_ms: dict[int, float] = field(default_factory=dict)
    score_cpu_ms: dict[int, float] = field(default_factory=dict)


@dataclass
class Drift:
    """Agreement of a candidate with a reference on the same context."""

    reference: str
    greedy_prefix: int
    tokens: int
    top1: float
    mean_kl: float


def chat_context(tokenizer: Tokenizer, target: int) -> list[int]:
    """A chat prompt of at least `target` tokens, built from whole note lines (no cut template)."""
    lines: list[str] = []
    ids: list[int] = []
    while len(ids) < target:
        lines.append(NOTES[len(lines) % len(NOTES)])
        ids = tokenizer.chat_ids(
            [
                Message("system", "You are a helpful assistant."),
                Message(
                    "user",
                    "My meeting notes:\n"
                    + "\n".join(lines)
                    + "\n\nWrite a short email to the team that summarizes them.",
                ),
            ]
        )
    return ids


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def drift(
    reference: str,
    ref_tokens: Sequence[int],
    ref_logits: np.ndarray,
    tokens: Sequence[int],
    logits: np.ndarray,
) -> Drift:
    """Greedy common prefix, top-1 agreement and mean KL(ref || candidate) per position."""
    vocab = min(ref_logits.shape[-1], logits.shape[-1])
    p, q = log_softmax(ref_logits[:, :vocab]), log_softmax(logits[:, :vocab])
    prefix = next(
        (i for i, (a, b) in enumerate(zip(ref_tokens, tokens, strict=True)) if a != b),
        min(len(ref_tokens), len(tokens)),
    )
    return Drift(
        reference=reference,
        greedy_prefix=prefix,
        tokens=len(ref_tokens),
        top1=float((p.argmax(-1) == q.argmax(-1)).mean()),
        mean_kl=float((np.exp(p) * (p - q)).sum(-1).mean()),
    )


def _median_ms(run: Callable[[], None], reps: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of `run` (CPU time resists other processes' load)."""
    run()  # warm-up (allocations, first-shape kernels)
    wall, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)


class OrtEngine:
    """A compiled model through the SDK's runtime seam (what the device and companion use)."""

    def __init__(self, name: str, precision: str) -> None:
        start = time.perf_counter()
        self.model = load_model(name, precision=precision, threads=1)
        self.load_s = time.perf_counter() - start
        self.label = f"ORT {precision}"

    def greedy(self, ctx: list[int], n: int) -> tuple[list[int], float, float, float]:
        """(tokens, prefill s, decode wall s, decode cpu s) for n greedy tokens."""
        session = self.model.new_session(max_length=len(ctx) + n + 8)
        start = time.perf_counter()
        logits = session.append(ctx)
        prefill = time.perf_counter() - start
        tokens: list[int] = []
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            tokens.append(int(np.argmax(logits[-1])))
            logits = session.append([tokens[-1]])
        return tokens, prefill, time.perf_counter() - wall, time.process_time() - cpu

    def score_ms(self, ctx: list[int], draft: list[int], ks: Sequence[int], reps: int) -> dict:
        session = self.model.new_session(max_length=len(ctx) + max(ks) + 8)
        session.append(ctx)

        def run(k: int) -> None:
            session.append(draft[:k])
            session.rewind(len(ctx))

        return {k: _median_ms(lambda k=k: run(k), reps) for k in ks}

    def teacher_forced(self, ctx: list[int], cont: list[int]) -> np.ndarray:
        """Logits predicting each token of `cont` after `ctx`: shape [len(cont), vocab]."""
        session = self.model.new_session(max_length=len(ctx) + len(cont) + 8)
        last = session.append(ctx)[-1:]
        return np.concatenate([last, session.append(cont)[:-1]])


class TorchEngine:
    """transformers fp32 on the dequantized GGUF, one thread, with a KV cache."""

    def __init__(self, name: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(1)
        self.torch = torch
        gguf = gguf_path(get_spec(name))
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        ).eval()
        self.load_s = time.perf_counter() - start
        self.label = "torch fp32"

    def _forward(self, ids: list[int], cache=None):
        ids_t = self.torch.tensor([ids])
        return self.model(input_ids=ids_t, past_key_values=cache, use_cache=True)

    def greedy(self, ctx: list[int], n: int) -> tuple[list[int], float, float, float]:
        with self.torch.inference_mode():
            start = time.perf_counter()
            out = self._forward(ctx)
            prefill = time.perf_counter() - start
            cache, tokens = out.past_key_values, []
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                tokens.append(int(out.logits[0, -1].argmax()))
                out = self._forward([tokens[-1]], cache)
                cache = out.past_key_values
        return tokens, prefill, time.perf_counter() - wall, time.process_time() - cpu

    def score_ms(self, ctx: list[int], draft: list[int], ks: Sequence[int], reps: int) -> dict:
        with self.torch.inference_mode():
            cache = self._forward(ctx).past_key_values

            def run(k: int) -> None:
                self._forward(draft[:k], cache)
                cache.crop(-k)  # transformers 5 crops by a negative count

            return {k: _median_ms(lambda k=k: run(k), reps) for k in ks}

    def teacher_forced(self, ctx: list[int], cont: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            logits = self._forward(ctx + cont).logits[0, len(ctx) - 1 : -1]
        return logits.float().numpy()


def time_engine(engine, ctx: list[int], args: argparse.Namespace) -> tuple[Timing, list[int]]:
    """Warm up, then greedy-decode and score on `ctx`; return timings and the greedy tokens."""
    engine.greedy(ctx[:32], 4)
    tokens, prefill, wall, cpu = engine.greedy(ctx, args.tokens)
    timing = Timing(
        engine=engine.label,
        load_s=round(engine.load_s, 2),
        prefill_s=prefill,
        decode_tok_s=args.tokens / wall,
        decode_cpu_tok_s=args.tokens / cpu,
    )
    scores = engine.score_ms(ctx, tokens, args.ks, args.reps)
    timing.score_ms = {k: wall for k, (wall, _) in scores.items()}
    timing.score_cpu_ms = {k: cpu for k, (_, cpu) in scores.items()}
    return timing, tokens


def bench_model(name: str, args: argparse.Namespace, say: Callable[[str], None]) -> dict | None:
    """All measurements of one model; None (with a note) when nothing of it can run."""
    spec = get_spec(name)
    order = [p for p in ("fp32", "int8", "w8a8", "int4") if p in args.precisions]
    present = [p for p in order if compiled_dir(spec, p).is_dir()]
    for p in order:
        if p not in present:
            say(
                f"note: {name} {p} not compiled, skipped "
                f"(`specsteer models compile {name} --precision {p}`)"
            )
    if not present:
        return None
    if not gguf_path(spec).exists():
        say(f"note: {name} GGUF not fetched: no torch reference, model skipped")
        return None
    tokenizer = Tokenizer.from_folder(compiled_dir(spec, present[0]))
    ctx = chat_context(tokenizer, args.context)

    say(f"{name}: loading torch fp32 from the GGUF")
    torch_engine = TorchEngine(name)
    say(f"{name}: torch baseline (before)")
    torch_before, torch_tokens = time_engine(torch_engine, ctx, args)
    torch_logits = torch_engine.teacher_forced(ctx, torch_tokens)

    ort: dict[str, dict] = {}
    reference: tuple[str, list[int], np.ndarray] = ("torch fp32", torch_tokens, torch_logits)
    for precision in present:
        say(f"{name}: ORT {precision}")
        engine = OrtEngine(name, precision)
        timing, tokens = time_engine(engine, ctx, args)
        vs_torch = drift(
            "torch fp32",
            torch_tokens,
            torch_logits,
            tokens,
            engine.teacher_forced(ctx, torch_tokens),
        )
        entry = {"timing": asdict(timing), "vs_torch": asdict(vs_torch), "tokens": tokens}
        ref_name, ref_tokens, ref_logits = reference
        if ref_name == "torch fp32":  # ORT fp32 itself, or no ORT fp32 in this run
            entry["vs_reference"] = entry["vs_torch"]
        else:
            entry["vs_reference"] = asdict(
                drift(
                    ref_name, ref_tokens, ref_logits, tokens, engine.teacher_forced(ctx, ref_tokens)
                )
            )
        if precision == "fp32":
            reference = ("ORT fp32", tokens, engine.teacher_forced(ctx, tokens))
        ort[precision] = entry
        del engine
        gc.collect()

    say(f"{name}: torch baseline (after)")
    torch_after, _ = time_engine(torch_engine, ctx, args)
    del torch_engine
    gc.collect()
    return {
        "model": name,
        "context_tokens": len(ctx),
        "new_tokens": args.tokens,
        "text": tokenizer.decode(ort[present[0]]["tokens"]),
        "torch": {"before": asdict(torch_before), "after": asdict(torch_after)},
        "ort": ort,
    }


def _mean(a: float, b: float) -> float:
    return (a + b) / 2


def print_tables(results: list[dict], ks: Sequence[int], console: Console) -> None:
    speed = Table(
        title="speed, 1 thread: wall / CPU time; × = ORT speed ÷ torch speed on CPU "
        "time (torch: mean of before and after)"
    )
    for col in ("model", "engine", "prefill s", "decode tok/s", *(f"score K={k} ms" for k in ks)):
        speed.add_column(col, justify="left" if col in ("model", "engine") else "right")
    drift_table = Table(
        title="drift over 64 tokens: greedy common prefix, teacher-forced "
        "top-1 agreement, mean KL(ref || candidate)"
    )
    for col in (
        "model",
        "precision",
        "reference",
        "greedy",
        "top-1",
        "KL",
        "vs torch: greedy",
        "top-1",
        "KL",
    ):
        drift_table.add_column(col)
    for r in results:
        t0, t1 = r["torch"]["before"], r["torch"]["after"]
        torch_tok_s = _mean(t0["decode_cpu_tok_s"], t1["decode_cpu_tok_s"])
        torch_ms = {k: _mean(t0["score_cpu_ms"][k], t1["score_cpu_ms"][k]) for k in ks}
        rows = [
            ("torch fp32 (before)", t0),
            *((f"ORT {p}", e["timing"]) for p, e in r["ort"].items()),
            ("torch fp32 (after)", t1),
        ]
        for label, t in rows:
            ort = label.startswith("ORT")
            speed.add_row(
                r["model"] if label.endswith("(before)") else "",
                label,
                f"{t['prefill_s']:.2f}",
                f"{t['decode_tok_s']:.1f} / {t['decode_cpu_tok_s']:.1f}"
                + (f" {t['decode_cpu_tok_s'] / torch_tok_s:.1f}×" if ort else ""),
                *(
                    f"{t['score_ms'][k]:.0f} / {t['score_cpu_ms'][k]:.0f}"
                    + (f" {torch_ms[k] / t['score_cpu_ms'][k]:.1f}×" if ort else "")
                    for k in ks
                ),
                end_section=label.endswith("(after)"),
            )
        for precision, entry in r["ort"].items():
            ref, tor = entry["vs_reference"], entry["vs_torch"]
            drift_table.add_row(
                r["model"],
                precision,
                ref["reference"],
                f"{ref['greedy_prefix']}/{ref['tokens']}",
                f"{100 * ref['top1']:.1f} %",
                f"{ref['mean_kl']:.2g}",
                f"{tor['greedy_prefix']}/{tor['tokens']}",
                f"{100 * tor['top1']:.1f} %",
                f"{tor['mean_kl']:.2g}",
            )
    console.print(speed)
    console.print(drift_table)


def markdown(results: list[dict], ks: Sequence[int]) -> str:
    """The speed and drift tables as Markdown (CPU-time figures, wall clock in brackets)."""
    head = (
        "| model | engine | prefill s (wall) | decode tok/s | "
        + " | ".join(f"score K={k} ms" for k in ks)
        + " | greedy | top-1 | KL | reference |"
    )
    lines = [head, "|" + "---|" * (8 + len(ks))]
    for r in results:
        t0, t1 = r["torch"]["before"], r["torch"]["after"]
        torch_tok_s = _mean(t0["decode_cpu_tok_s"], t1["decode_cpu_tok_s"])
        torch_ms = {k: _mean(t0["score_cpu_ms"][k], t1["score_cpu_ms"][k]) for k in ks}
        rows = [
            ("torch fp32 (before)", t0, None),
            *((f"ORT {p}", e["timing"], e["vs_reference"]) for p, e in r["ort"].items()),
            ("torch fp32 (after)", t1, None),
        ]
        for label, t, d in rows:
            ort = d is not None
            cells = [
                r["model"],
                label,
                f"{t['prefill_s']:.2f}",
                f"{t['decode_cpu_tok_s']:.1f} ({t['decode_tok_s']:.1f})"
                + (f" **{t['decode_cpu_tok_s'] / torch_tok_s:.1f}×**" if ort else ""),
            ]
            cells += [
                f"{t['score_cpu_ms'][k]:.0f} ({t['score_ms'][k]:.0f})"
                + (f" **{torch_ms[k] / t['score_cpu_ms'][k]:.1f}×**" if ort else "")
                for k in ks
            ]
            cells += (
                [
                    f"{d['greedy_prefix']}/{d['tokens']}",
                    f"{100 * d['top1']:.1f} %",
                    f"{d['mean_kl']:.2g}",
                    d["reference"],
                ]
                if ort
                else ["", "", "", ""]
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8"], choices=PRECISIONS)
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens decoded")
    parser.add_argument("--context", type=int, default=300, help="context length, tokens")
    parser.add_argument("--ks", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=5, help="scoring repetitions (median)")
    parser.add_argument("--json", type=Path, help="write all measurements here")
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown here")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    results: list[dict] = []
    meta = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "argv": sys.argv,
        "time": time.strftime("%F %T"),
    }
    for name in args.models:
        result = bench_model(name, args, lambda m: console.print(m, markup=False, style="dim"))
        if result is not None:
            results.append(result)
        # written after every model: a later model's failure must not lose the earlier ones
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        if args.markdown:
            args.markdown.write_text(markdown(results, args.ks))
    print_tables(results, args.ks, Console())

if __name__ == "__main__":
    main()
