"""Quality, acceptance and wait against the private prompt budget, per task (issue 15 item 4).

Reads `specsteer-lab eval` results folders of one task run at different `--max-prompt-tokens`
(each folder's run.json holds its budget) and prints, per budget and method, over the users
that every budget of the method ran on: the private prompt
tokens actually used, ROUGE-1/L, acceptance, private prefill, TTFT, tokens and total time (each
the mean over users; acceptance the mean of the users' rates); then each budget against
the largest one on the users both ran, paired (ROUGE by `eval.compare.paired_difference`,
acceptance by the same paired bootstrap). A difference whose 95 % interval excludes 0 is marked
`*`. No model time: the folders are made by e.g.

    specsteer-lab eval --task email --users 8 --methods specsteer@0.5 --max-new-tokens 128 \
      --max-prompt-tokens 256 --threads 2 --precision int8 --out runs/email-256

    python bench/prompt_budget.py runs/email-256 runs/email-512 runs/email-1024
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specsteer_lab.eval.compare import interval_cell, mean_cell, paired_difference
from specsteer_lab.eval.harness import RESULTS, read_results, read_run_config
from specsteer_lab.quality import Interval, paired_bootstrap


def load_folder(folder: Path) -> tuple[str, int, list[dict[str, Any]]]:
    """(task, budget, rows) of one results folder."""
    config = read_run_config(folder)
    return config["task"], int(config["max_prompt_tokens"]), read_results(folder / RESULTS)


def acceptance_difference(rows: Sequence[Mapping[str, Any]], method: str,
                          baseline: str) -> Interval | None:
    """Paired interval of mean acceptance (points) of `method` minus `baseline`."""
    mine = {row["user"]: row for row in rows if row["method"] == method
            and row.get("acceptance") is not None}
    theirs = {row["user"]: row for row in rows if row["method"] == baseline
              and row.get("acceptance") is not None}
    users = sorted(mine.keys() & theirs.keys())
    if not users:
        return None
    return paired_bootstrap([100 * mine[u]["acceptance"] for u in users],
                            [100 * theirs[u]["acceptance"] for u in users])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="results folders of one task")
    args = parser.parse_args()
    runs = sorted((load_folder(folder) for folder in args.folders), key=lambda run: run[1])
    tasks = {task for task, _, _ in runs}
    if len(tasks) != 1:
        parser.error(f"the folders hold more than one task: {sorted(tasks)}")
    largest = runs[-1][1]
    # one row set, each method labelled with its budget: "specsteer@0.5 / 512"
    rows = [{**row, "method": f"{row['method']} / {budget}"}
            for _, budget, found in runs for row in found]
    methods = list(dict.fromkeys(row["method"].rsplit(" / ", 1)[0] for row in rows))
    # every number of a method is over the users every budget of it ran on: the same users
    for method in methods:
        ran = [{row["user"] for row in rows if row["method"] == f"{method} / {budget}"}
               for _, budget, _ in runs]
        common = set.intersection(*[users for users in ran if users])
        rows = [row for row in rows if row["method"].rsplit(" / ", 1)[0] != method
                or row["user"] in common]
    print(f"task {tasks.pop()}; differences against budget {largest} on the same users")
    print("| method | budget | users | private prompt tokens | ROUGE-1 | ROUGE-L | acceptance % "
          "| prefill s | TTFT s | tokens | total s | ROUGE-1 − largest | ROUGE-L − largest "
          "| acceptance − largest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for method in methods:
        for _, budget, _ in runs:
            label, top = f"{method} / {budget}", f"{method} / {largest}"
            mine = [row for row in rows if row["method"] == label]
            if not mine:
                continue
            deltas = ["–", "–", "–"] if budget == largest else [
                interval_cell(d.interval if (d := paired_difference(rows, label, top, metric))
                              else None) for metric in ("rouge1", "rougeL")
            ] + [interval_cell(acceptance_difference(rows, label, top))]
            print(f"| {method} | {budget} | {len(mine)} "
                  f"| {mean_cell(mine, 'private_prompt_tokens')} "
                  f"| {mean_cell(mine, 'rouge1', 100)} | {mean_cell(mine, 'rougeL', 100)} "
                  f"| {mean_cell(mine, 'acceptance', 100)} | {mean_cell(mine, 'prefill_s')} "
                  f"| {mean_cell(mine, 'ttft_s')} | {mean_cell(mine, 'tokens')} "
                  f"| {mean_cell(mine, 'wall_s')} | {' | '.join(deltas)} |")


if __name__ == "__main__":
    main()
