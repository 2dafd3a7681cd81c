"""One setting changed, everything else the same: what it does to each method's texts.

Reads `specsteer-lab eval` results folders of one task that differ in some run settings
(`run.json`: alpha, no_repeat_ngram, end_release, ...) and prints, per method and folder, over
the users every folder of that method ran on: ROUGE-1/L, acceptance, tokens, the median length
ratio, how many texts loop (a word 6-gram seen three times or more) and how many differ from
the first folder's; then each folder against the first, paired (ROUGE by
`eval.compare.paired_difference`). A difference whose 95 % interval excludes 0 is marked `*`.
Folders are labelled by the settings that differ between them. No model time: the folders are
made by e.g.

    specsteer-lab eval --task abstract --users 8 --methods specsteer@0.5 --max-new-tokens 256 \
      --alpha 1 --out runs/abs-a1
    specsteer-lab eval --task abstract --users 8 --methods specsteer@0.5 --max-new-tokens 256 \
      --alpha 2 --out runs/abs-a2

    python bench/compare_runs.py runs/abs-a1 runs/abs-a2

`--users-from N` keeps the users from the N-th on (in the first folder's order, the data set's):
a setting chosen on the first users is then checked on users it was not chosen on.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specsteer_lab.eval.compare import interval_cell, mean_cell, paired_difference
from specsteer_lab.eval.harness import RESULTS, read_results, read_run_config

LOOP_NGRAM, LOOP_TIMES = 6, 3
# settings that name the run rather than the decoding (never a label)
_NOT_SETTINGS = {"specialist_sha256", "generalist_sha256"}


def loops(text: str, n: int = LOOP_NGRAM, times: int = LOOP_TIMES) -> bool:
    """Whether `text` repeats a word n-gram `times` times or more (a verbatim loop)."""
    words = text.split()
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return any(count >= times for count in grams.values())


def labels(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each folder's name: the settings whose values differ between the folders."""
    keys = sorted({key for config in configs for key in config} - _NOT_SETTINGS)
    differing = [key for key in keys if len({json.dumps(c.get(key)) for c in configs}) > 1]
    if not differing:
        return [f"run {index + 1}" for index in range(len(configs))]
    return [", ".join(f"{key}={config.get(key)}" for key in differing) for config in configs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+",
                        help="results folders of one task; the first is the reference")
    parser.add_argument("--users-from", type=int, default=1, metavar="N",
                        help="only the users from the N-th on, in the first folder's order")
    args = parser.parse_args()
    if args.users_from < 1:
        parser.error("--users-from counts from 1")
    configs = [read_run_config(folder) for folder in args.folders]
    if len({config["task"] for config in configs}) != 1:
        parser.error("the folders hold more than one task")
    names = labels(configs)
    found = [read_results(folder / RESULTS) for folder in args.folders]
    kept = set(list(dict.fromkeys(row["user"] for row in found[0]))[args.users_from - 1:])
    found = [[row for row in rows if row["user"] in kept] for rows in found]
    methods = [m for m in dict.fromkeys(row["method"] for row in found[0])
               if all(any(row["method"] == m for row in rows) for rows in found[1:])]
    since = f" (users {args.users_from} on)" if args.users_from > 1 else ""
    print(f"task {configs[0]['task']}; each run against `{names[0]}` on the same users{since}")
    print("| method | run | users | ROUGE-1 | ROUGE-L | acceptance % | tokens | length ratio "
          "(median) | loops | texts changed | ROUGE-1 − first | ROUGE-L − first |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for method in methods:
        per_run = [{row["user"]: row for row in rows if row["method"] == method} for rows in found]
        users = set.intersection(*(set(runs) for runs in per_run))
        reference = per_run[0]
        for index, (name, runs) in enumerate(zip(names, per_run, strict=True)):
            mine = [runs[user] for user in sorted(users)]
            changed = sum(runs[user]["text"] != reference[user]["text"] for user in users)
            deltas = ["–", "–"]
            if index:
                pair = [{**row, "method": "run"} for row in mine] \
                    + [{**reference[user], "method": "first"} for user in sorted(users)]
                deltas = [interval_cell(d.interval if d else None) for d in (
                    paired_difference(pair, "run", "first", m) for m in ("rouge1", "rougeL"))]
            ratios = [row["length_ratio"] for row in mine if row.get("length_ratio") is not None]
            ratio = f"{statistics.median(ratios):.2f}" if ratios else "–"
            print(f"| {method} | {name} | {len(mine)} | {mean_cell(mine, 'rouge1', 100)} "
                  f"| {mean_cell(mine, 'rougeL', 100)} | {mean_cell(mine, 'acceptance', 100)} "
                  f"| {mean_cell(mine, 'tokens')} | {ratio} "
                  f"| {sum(loops(row['text']) for row in mine)}/{len(mine)} "
                  f"| {changed if index else '–'} | {' | '.join(deltas)} |")


if __name__ == "__main__":
    main()
