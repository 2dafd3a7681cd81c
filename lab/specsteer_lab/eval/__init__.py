"""The evaluation harness: SpecSteer and every baseline on real per-user histories.

`data` loads examples (shared data sets, LaMP/LongLaMP files), `harness` runs each method through
the real decoding loop and companion protocol and writes results.jsonl, `metrics` scores ROUGE,
`voice` measures length and style against each user's own history, `compare` bounds SpecSteer's
paired differences to each baseline, `report` turns results into the papers' tables, those
measures and a quality-vs-speed plot. Nothing here changes
how a method decodes: it measures `specsteer.device.decode` as an app would call it.
"""

from __future__ import annotations

from specsteer_lab.eval.data import EvalError, Example, load_examples, load_lamp
from specsteer_lab.eval.harness import (
    DEFAULT_METHODS,
    EvalConfig,
    Harness,
    MethodSpec,
    parse_method,
    parse_methods,
    read_results,
    run_eval,
)
from specsteer_lab.eval.metrics import Rouge, rouge
from specsteer_lab.eval.report import plot_quality_vs_speed, render_report, summarize

__all__ = [
    "DEFAULT_METHODS",
    "EvalConfig",
    "EvalError",
    "Example",
    "Harness",
    "MethodSpec",
    "Rouge",
    "load_examples",
    "load_lamp",
    "parse_method",
    "parse_methods",
    "plot_quality_vs_speed",
    "read_results",
    "render_report",
    "rouge",
    "run_eval",
    "summarize",
]
