"""How sure a run is that SpecSteer beats each baseline: paired differences over the same users.

Owns pairing results rows of two methods by user and the paired bootstrap 95 % interval of the
mean difference (SpecSteer minus baseline) of ROUGE-1 and ROUGE-L, in points (%), via
`specsteer_lab.quality.paired_bootstrap`. Only users with a row of both methods count. Owns no
measurement: it reads rows written by the harness.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specsteer_lab.quality import Interval, paired_bootstrap

METRICS = ("rouge1", "rougeL")
METRIC_NAMES = {"rouge1": "ROUGE-1", "rougeL": "ROUGE-L"}


@dataclass(frozen=True)
class Difference:
    """`method` minus `baseline` on one metric over the users both were run on (in points)."""

    method: str
    baseline: str
    metric: str
    interval: Interval

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "baseline": self.baseline, "metric": self.metric,
                **asdict(self.interval)}


def _by_user(rows: Sequence[Mapping[str, Any]], label: str) -> dict[str, Mapping[str, Any]]:
    return {str(row["user"]): row for row in rows if str(row["method"]) == label}


def paired_difference(rows: Sequence[Mapping[str, Any]], method: str, baseline: str,
                      metric: str, *, seed: int = 0) -> Difference | None:
    """Interval of mean(method - baseline) on `metric` over shared users; None if none share."""
    mine, theirs = _by_user(rows, method), _by_user(rows, baseline)
    users = sorted(mine.keys() & theirs.keys())
    if not users:
        return None
    interval = paired_bootstrap([100 * float(mine[user][metric]) for user in users],
                                [100 * float(theirs[user][metric]) for user in users], seed=seed)
    return Difference(method, baseline, metric, interval)


def specsteer_differences(rows: Sequence[Mapping[str, Any]]) -> list[Difference]:
    """Every SpecSteer label of the run against every other method, ROUGE-1 then ROUGE-L."""
    labels = list(dict.fromkeys(str(row["method"]) for row in rows))
    bases = {str(row["method"]): str(row.get("base_method", row["method"])) for row in rows}
    ours = [label for label in labels if bases[label] == "specsteer"]
    others = [label for label in labels if bases[label] != "specsteer"]
    found = (paired_difference(rows, method, baseline, metric)
             for method in ours for baseline in others for metric in METRICS)
    return [difference for difference in found if difference is not None]


def mean_cell(rows: Sequence[Mapping[str, Any]], key: str, scale: float = 1.0) -> str:
    """The mean of `key` over the rows that have it, times `scale`, as `12.34`; `–` for none."""
    values = [float(row[key]) * scale for row in rows if row.get(key) is not None]
    return f"{statistics.mean(values):.2f}" if values else "–"


def interval_cell(interval: Interval | None) -> str:
    """`+1.00 [-0.48, +2.58]`, with ` *` when the interval excludes 0; `–` for none."""
    if interval is None:
        return "–"
    mark = " *" if interval.excludes_zero else ""
    return f"{interval.mean:+.2f} [{interval.low:+.2f}, {interval.high:+.2f}]{mark}"


def differences_table(differences: Sequence[Difference], names: Mapping[str, str]) -> str:
    """Markdown: one line per (method, baseline), both metrics with their intervals."""
    if not differences:
        return ""
    pairs: dict[tuple[str, str], dict[str, Difference]] = {}
    for difference in differences:
        pairs.setdefault((difference.method, difference.baseline), {})[difference.metric] = \
            difference
    lines = ["| Difference | users | ROUGE-1 (95 % CI) | ROUGE-L (95 % CI) |", "|---|---|---|---|"]
    for (method, baseline), by_metric in pairs.items():
        cells = [interval_cell(found.interval if (found := by_metric.get(metric)) else None)
                 for metric in METRICS]
        n = next(iter(by_metric.values())).interval.n
        lines.append(f"| {names.get(method, method)} − {names.get(baseline, baseline)} | {n} "
                     f"| {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
