"""Summaries of a results.jsonl: a Markdown table in the shape of the papers' Tables 2 and 4, the
measures a user would feel (length ratio, style margin), SpecSteer's paired differences to each
baseline with 95 % intervals (`compare`), the same as JSON, and a quality-versus-speed plot.

Speed-ups are always over the LLM baseline *of the same run* (same machine, same users, same
settings): comparing with numbers from another run or another machine is meaningless. Owns no
measurement: it only aggregates rows written by the harness.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specsteer.device import METHODS
from specsteer_lab.eval.compare import differences_table, specsteer_differences

_NAMES = {
    "slm": "SLM",
    "slm_rag": "SLM+RAG",
    "llm": "LLM",
    "speculative": "Speculative",
    "light_costeer": "LightCoSteer",
    "costeer": "CoSteer",
    "specsteer": "SpecSteer",
}


@dataclass(frozen=True)
class MethodSummary:
    """One method's aggregates over its rows (ratios of sums, so long texts weigh more)."""

    label: str
    base_method: str
    gamma: float | None
    n: int
    rouge1: float
    rougeL: float  # noqa: N815 - the metric's own name
    acceptance: float | None
    tokens_per_s: float
    decode_tokens_per_s: float | None
    ttft_s: float
    tokens: float  # mean generated tokens
    round_trips_per_token: float
    bytes_up_per_token: float
    bytes_down_per_token: float
    speedup: float | None = None  # tokens/s over the LLM's tokens/s in the same run
    length_ratio: float | None = None  # median over users of output words / user's median words
    style_own: float | None = None  # mean cosine with the user's own history (n-gram profile)
    style_margin: float | None = None  # mean of own minus other users' cosine

    @property
    def name(self) -> str:
        base = _NAMES.get(self.base_method, self.base_method)
        _, preset = self.label.partition(":")[::2]  # "specsteer:fast": a preset's settings
        if preset:
            base = f"{base} {preset}"
        return f"{base} (γ={self.gamma:g})" if self.gamma is not None else base


def _order(label: str, base: str, gamma: float | None) -> tuple[int, float, str]:
    rank = METHODS.index(base) if base in METHODS else len(METHODS)
    return rank, -(gamma or 0.0), label


def _present(group: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in group if r.get(key) is not None]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[MethodSummary]:
    """Per-method aggregates in the papers' order (baselines first, SpecSteer by falling gamma)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row["method"]), []).append(row)
    summaries = []
    for label, group in groups.items():
        n = len(group)
        tokens = sum(int(r["tokens"]) for r in group)
        seconds = sum(float(r["effective_s"]) for r in group)
        drafted = sum(int(r.get("drafted") or 0) for r in group)
        accepted = sum(int(r.get("accepted") or 0) for r in group)
        after_first = sum(max(int(r["tokens"]) - 1, 0) for r in group)
        decode_s = sum(float(r["effective_s"]) - float(r["ttft_s"]) for r in group)
        summaries.append(MethodSummary(
            label=label,
            base_method=str(group[0].get("base_method", label)),
            gamma=group[0].get("gamma"),
            n=n,
            rouge1=sum(float(r["rouge1"]) for r in group) / n,
            rougeL=sum(float(r["rougeL"]) for r in group) / n,
            acceptance=accepted / drafted if drafted else None,
            tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
            decode_tokens_per_s=after_first / decode_s if decode_s > 0 and after_first else None,
            ttft_s=sum(float(r["ttft_s"]) for r in group) / n,
            tokens=tokens / n,
            round_trips_per_token=sum(int(r.get("round_trips") or 0) for r in group) / tokens
            if tokens else 0.0,
            bytes_up_per_token=sum(int(r["bytes_up"]) for r in group) / tokens if tokens else 0.0,
            bytes_down_per_token=sum(int(r["bytes_down"]) for r in group) / tokens
            if tokens else 0.0,
            length_ratio=_median(_present(group, "length_ratio")),
            style_own=_mean(_present(group, "style_own")),
            style_margin=_mean(_present(group, "style_margin")),
        ))
    llm = next((s for s in summaries if s.base_method == "llm"), None)
    if llm is not None and llm.tokens_per_s > 0:
        summaries = [_with_speedup(s, s.tokens_per_s / llm.tokens_per_s) for s in summaries]
    return sorted(summaries, key=lambda s: _order(s.label, s.base_method, s.gamma))


def _with_speedup(summary: MethodSummary, speedup: float) -> MethodSummary:
    return MethodSummary(**{**summary.__dict__, "speedup": speedup})


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _percent(value: float | None) -> str:
    return _fmt(None if value is None else value * 100, 1, " %")


def markdown_table(summaries: Sequence[MethodSummary]) -> str:
    """The main table: quality, acceptance, speed and wire cost per method."""
    header = ("| Method | n | ROUGE-1 | ROUGE-L | Accept. | tok/s | Speed-up vs LLM | decode tok/s "
              "| TTFT s | tokens | trips/tok | B↑/tok | B↓/tok |")
    lines = [header, "|" + "---|" * 13]
    for s in summaries:
        lines.append(
            f"| {s.name} | {s.n} | {s.rouge1 * 100:.2f} | {s.rougeL * 100:.2f} "
            f"| {_percent(s.acceptance)} "
            f"| {s.tokens_per_s:.2f} | {_fmt(s.speedup, 2, '×')} "
            f"| {_fmt(s.decode_tokens_per_s)} | {s.ttft_s:.2f} | {s.tokens:.1f} "
            f"| {s.round_trips_per_token:.2f} | {s.bytes_up_per_token:.1f} "
            f"| {s.bytes_down_per_token:.1f} |"
        )
    return "\n".join(lines)


def voice_table(summaries: Sequence[MethodSummary]) -> str:
    """What a user would feel: quality, length against their own and style against others'."""
    lines = ["| Method | n | ROUGE-1 | ROUGE-L | median length ratio | style: own | style margin |",
             "|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s.name} | {s.n} | {s.rouge1 * 100:.2f} | {s.rougeL * 100:.2f} "
                     f"| {_fmt(s.length_ratio)} | {_fmt(s.style_own, 3)} "
                     f"| {_fmt(s.style_margin, 3, '')} |")
    return "\n".join(lines)


def gamma_table(summaries: Sequence[MethodSummary]) -> str:
    """Table 4's ablation: SpecSteer's acceptance and speed-up as gamma falls."""
    rows = [s for s in summaries if s.base_method == "specsteer"]
    if len(rows) < 2:
        return ""
    lines = ["| γ | Accept. | Speed-up vs LLM | ROUGE-L |", "|---|---|---|---|"]
    for s in rows:
        lines.append(f"| {s.gamma:g} | {_percent(s.acceptance)} | {_fmt(s.speedup, 2, '×')} "
                     f"| {s.rougeL * 100:.2f} |")
    return "\n".join(lines)


def render_report(rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None,
                  plot_name: str | None = None) -> str:
    """The whole report.md: setup, the main table, the gamma ablation and column notes."""
    summaries = summarize(rows)
    users = sorted({str(r["user"]) for r in rows})
    parts = ["# SpecSteer evaluation", ""]
    if config:
        setup = ", ".join(f"{key}={config[key]}" for key in (
            "task", "specialist", "generalist", "max_new_tokens", "retrieve_k", "rtt_ms",
            "k", "alpha", "top_k", "max_prompt_tokens") if key in config)
        parts += [f"Setup: {setup}; {len(users)} users.", ""]
    parts += [markdown_table(summaries), ""]
    parts += ["## What a user would feel", "", voice_table(summaries), ""]
    names = {s.label: s.name for s in summaries}
    differences = differences_table(specsteer_differences(rows), names)
    if differences:
        parts += ["## SpecSteer minus each baseline (paired over users)", "", differences, ""]
    ablation = gamma_table(summaries)
    if ablation:
        parts += ["## SpecSteer verification threshold", "", ablation, ""]
    if plot_name:
        parts += [f"![quality vs speed]({plot_name})", ""]
    parts += [
        "ROUGE in %, F1, stemmed (means over users). Accept.: accepted / drafted tokens. "
        "tok/s: generated tokens / wall time from the request to the last token (prefills "
        "included), summed over users; decode tok/s leaves out the time to the first token. "
        "Speed-up: tok/s over the LLM's tok/s in this run. trips/tok: companion round trips "
        "(session open included) per token; B↑/B↓ per token: protocol bytes to and from the "
        "companion (the handshake excluded). LLM times exclude the Specialist work the decoding "
        "loop runs alongside but that baseline does not use.",
        "",
        "Median length ratio: the median over users of the output's words over the user's "
        "median words in their own history texts (1.00 = typical; below 0.50 reads as cut "
        "short). Style: cosine of the output's character 3–5-gram profile with the user's own "
        "history; margin: that minus the mean cosine with the other users' histories in this "
        "run (> 0: reads more like its user than like the others). Differences: mean of "
        "SpecSteer minus the baseline over the users both ran on, in ROUGE points, with the "
        "paired bootstrap 95 % interval (2000 resamples of users, seed 0); * marks an interval "
        "that excludes 0.",
        "",
    ]
    return "\n".join(parts)


def report_json(rows: Sequence[Mapping[str, Any]],
                config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report's numbers as JSON: setup, per-method summaries and the paired differences."""
    return {
        "config": dict(config or {}),
        "users": len({str(r["user"]) for r in rows}),
        "methods": [{**asdict(s), "name": s.name} for s in summarize(rows)],
        "differences": [d.as_dict() for d in specsteer_differences(rows)],
    }


def plot_quality_vs_speed(rows: Sequence[Mapping[str, Any]],
                          path: str | os.PathLike[str]) -> Path:
    """ROUGE-L against tokens/s per method, local methods hollow: where SpecSteer should sit
    is up and to the right of both SLM+RAG and LLM."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    summaries = summarize(rows)
    figure, axes = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for index, s in enumerate(summaries):
        if s.base_method in ("slm", "slm_rag"):
            axes.scatter(s.tokens_per_s, s.rougeL * 100, s=60, facecolors="none",
                         edgecolors="C0")
        else:
            axes.scatter(s.tokens_per_s, s.rougeL * 100, s=60,
                         color="C3" if s.base_method == "specsteer" else "C1")
        # alternate label sides: methods often tie on one axis and labels would overlap
        axes.annotate(s.name, (s.tokens_per_s, s.rougeL * 100), textcoords="offset points",
                      xytext=(6, 5 if index % 2 == 0 else -11), fontsize=8)
    speeds = [s.tokens_per_s for s in summaries if s.tokens_per_s > 0]
    if speeds and max(speeds) > 4 * min(speeds):
        axes.set_xscale("log")  # local and per-token methods differ by an order of magnitude
        axes.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("tokens / s (end to end)")
    axes.set_ylabel("ROUGE-L F1 (%)")
    axes.set_title("Quality vs speed")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target)
    plt.close(figure)
    return target
