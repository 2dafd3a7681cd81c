"""Continuing a draft on the real pair: what the companion must read to steer a continuation.

For a few half-written notes of the sample persona (`sample_apps/data`), one greedy SpecSteer
continuation each (Qwen2.5 0.5B device, 1.5B companion in process) with the draft
  * public — the SDK's `prefix`: both prompts end with the draft (what the apps do);
  * private — the draft ends the device's prompt only; the companion sees the title request
    and the drafted tokens (the alternative docs/apps.md weighs; warm start off, since the
    Generalist's first tokens could not continue a text it has not read).
Prints each continuation and its acceptance rate, and the mean per variant.

    flock /tmp/specsteer-heavy.lock python bench/continue_draft.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from specsteer.client import Client
from specsteer.device import DevicePrompt
from specsteer.history import HistoryStore
from specsteer.history.ingest import ingest_path
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

APPS = Path(__file__).resolve().parents[1] / "sample_apps"
sys.path.insert(0, str(APPS))
from companion import models  # noqa: E402

DRAFTS = [
    ("Bulb planting day",
     "Bulbs go in this Saturday, 10 till 12, by the kids' corner.\n\nPractical bits:\n-"),
    ("Shed roof leak",
     "The shed roof is leaking again, right over the seed trays. Tomasz had a look on Sunday and"),
    ("Autumn clear-up", "Clear-up day went better than I feared. Nine people, two wheelbarrows,"),
]


class DraftKeptPrivate(Client):
    """The alternative: the draft ends the private prompt only (the public one as without)."""

    def render(self, query, **options):  # noqa: ANN001, ANN003, ANN201
        prompt, both = super().render(query, **options)
        if not prompt.prefix:
            return prompt, both
        drafted = len(self.specialist.tokenizer.encode(prompt.prefix))
        return prompt, DevicePrompt(both.private_ids, list(both.public_ids)[:-drafted])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=60)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    specialist_dir, generalist_dir = models(True)
    specialist, generalist = load_model(specialist_dir), load_model(generalist_dir)
    store = HistoryStore(Path(tempfile.mkdtemp()) / "persona.db")
    for name in ("notes.json", "sent.mbox"):
        ingest_path(store, APPS / "data" / name)
    verifier = Verifier(generalist, specialist)
    runs = []
    for variant, kind, options in (("public", Client, {}),
                                   ("private", DraftKeptPrivate, {"warm_start": False})):
        client = kind(specialist, history=store,
                      companion=lambda: LocalChannel.for_verifier(verifier))
        for title, draft in DRAFTS:
            result = client.generate({"topic": title}, task="note", prefix=draft,
                                     max_new_tokens=args.max_new_tokens, offline="fail",
                                     temperature=0.0, **options)
            runs.append({"variant": variant, "title": title, "draft": draft,
                         "continuation": result.text,
                         "acceptance_rate": round(result.stats.acceptance_rate, 3)})
            print(f"[{variant}] {title}: ...{draft[-40:]!r}\n  -> {result.text!r}\n"
                  f"  acceptance {result.stats.acceptance_rate:.2f}", flush=True)
    for variant in ("public", "private"):
        rates = [run["acceptance_rate"] for run in runs if run["variant"] == variant]
        print(f"{variant}: mean acceptance {statistics.mean(rates):.2f} over {len(rates)} drafts")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
