"""What the user's history is worth to the Generalist itself: a collaborative method's ceiling.

SpecSteer's Generalist never sees the history. The most the history can add, for a given
Generalist, is what that same model writes when it does see it: SLM+RAG run with the Generalist
as the Specialist. That run breaks the privacy the method exists for, so it is a reference,
not a method. If the reference cannot beat the LLM alone, no method that keeps the history on
the device can be expected to, and a target of "above the LLM" is beyond the model pair.

Reads a results folder with the LLM (and SpecSteer) and a reference folder of the same task
made with `--specialist <that run's Generalist> --methods slm_rag`, checks by SHA-256 that the
reference's Specialist is the run's Generalist, and prints, on the users both ran, each
method's ROUGE-1/L and the paired differences (95 % bootstrap intervals, `*` when 0 is outside):
reference − LLM, and each SpecSteer label − LLM and − reference. No model time: e.g.

    specsteer-lab eval --task email --users 40 --methods llm specsteer@0.5 \
      --max-new-tokens 256 --out runs/email
    specsteer-lab eval --task email --users 40 --specialist qwen2.5-1.5b --methods slm_rag \
      --max-new-tokens 256 --out runs/email-ref

    python bench/history_ceiling.py runs/email runs/email-ref
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specsteer_lab.eval.compare import interval_cell, mean_cell, paired_difference
from specsteer_lab.eval.harness import RESULTS, read_results, read_run_config

REFERENCE = "Generalist reading the history"
# run settings that may differ between the two folders (the reference has its own Specialist)
_MODEL_KEYS = {"specialist", "specialist_sha256", "generalist", "generalist_sha256"}


def check_pairing(run: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    """Refuse folders that do not make a reference pair (one line, for the command line)."""
    if reference.get("specialist_sha256") != run.get("generalist_sha256"):
        raise SystemExit(
            f"the reference's Specialist ({reference.get('specialist')}) is not the run's "
            f"Generalist ({run.get('generalist')}): make it with --specialist "
            f"{run.get('generalist')} --methods slm_rag")
    # a key only one folder has is a setting added between the runs, at its old behaviour
    differing = sorted(key for key in (run.keys() & reference.keys()) - _MODEL_KEYS
                       if run[key] != reference[key])
    if differing:
        raise SystemExit(f"the folders differ in {', '.join(differing)}: run the reference "
                         "with the run's settings")


def ceiling_rows(run_rows: Sequence[Mapping[str, Any]],
                 reference_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row list holding the run's rows and the reference's SLM+RAG rows as `REFERENCE`,
    on the users that both the LLM and the reference ran."""
    reference = [{**row, "method": REFERENCE} for row in reference_rows
                 if row["method"] == "slm_rag"]
    users = ({row["user"] for row in reference}
             & {row["user"] for row in run_rows if row["method"] == "llm"})
    return [row for row in [*run_rows, *reference] if row["user"] in users]


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines: each method's means, then the paired differences to the LLM and to the
    reference."""
    methods = list(dict.fromkeys(str(row["method"]) for row in rows))
    users = len({row["user"] for row in rows})
    lines = [f"{users} users", "| method | ROUGE-1 | ROUGE-L | − LLM, ROUGE-1 | − LLM, ROUGE-L "
             "| − reference, ROUGE-1 | − reference, ROUGE-L |", "|---|---|---|---|---|---|---|"]
    for method in methods:
        mine = [row for row in rows if row["method"] == method]
        cells = []
        for baseline in ("llm", REFERENCE):
            for metric in ("rouge1", "rougeL"):
                found = (paired_difference(rows, method, baseline, metric)
                         if method not in ("llm", baseline) else None)
                cells.append(interval_cell(found.interval if found else None))
        lines.append(f"| {method} | {mean_cell(mine, 'rouge1', 100)} "
                     f"| {mean_cell(mine, 'rougeL', 100)} | {' | '.join(cells)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="results folder with the LLM (and SpecSteer)")
    parser.add_argument("reference", type=Path,
                        help="results folder of SLM+RAG with the run's Generalist as Specialist")
    args = parser.parse_args()
    configs = [read_run_config(folder) for folder in (args.run, args.reference)]
    check_pairing(*configs)
    rows = ceiling_rows(read_results(args.run / RESULTS), read_results(args.reference / RESULTS))
    if not rows:
        raise SystemExit("no user has both an LLM row and a reference row")
    print(f"task {configs[0]['task']}; Generalist {configs[0]['generalist']}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
