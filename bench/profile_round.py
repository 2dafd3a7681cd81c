"""Where a SpecSteer generation's time goes: model passes per role vs everything else.

One greedy generation per user with an in-process companion (the same frames as the network,
no socket, no overlap: device and companion take turns on one core). Model time is attributed
by the session that ran it: the device's Specialist (drafting with the
private context), the companion's generic Specialist (P_S0) and its Generalist; the rest is
Python — protocol, alignment across tokenizers, sparse vectors, fusion. `--top N` also runs
cProfile and prints its top N functions (its overhead then inflates the Python share).

    python bench/profile_round.py --specialist smollm2-135m --generalist qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_model
from specsteer.runtime.base import LanguageModel
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier
from specsteer_lab.eval.data import shared_file


class TimedModel:
    """A LanguageModel whose sessions add their append time to `spent[role]`."""

    def __init__(self, model: LanguageModel, role: str, spent: dict[str, float]) -> None:
        self._model, self._role, self._spent = model, role, spent

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def new_session(self, **kwargs):
        return TimedSession(self._model.new_session(**kwargs), self._role, self._spent)


class TimedSession:
    """A session that books its first append as the role's prefill, the others as rounds."""

    def __init__(self, session, role: str, spent: dict[str, float]) -> None:
        self._session, self._role, self._spent = session, role, spent
        self._prefilled = False

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def append(self, ids):
        role = self._role if self._prefilled else f"{self._role} (prefill)"
        self._prefilled = True
        started = time.perf_counter()
        try:
            return self._session.append(ids)
        finally:
            self._spent[role] += time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--generalist", default="qwen2.5-1.5b")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--specialist-precision")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--top", type=int, default=0,
                    help="also profile and print cProfile's top N functions (slows Python down)")
    args = ap.parse_args()
    spent: dict[str, float] = defaultdict(float)
    specialist = load_model(args.specialist, precision=args.specialist_precision or args.precision)
    generalist = load_model(args.generalist, precision=args.precision)
    timed: Any = TimedModel  # duck-typed LanguageModel
    verifier = Verifier(timed(generalist, "companion: Generalist", spent),
                        timed(specialist, "companion: P_S0", spent))
    device = timed(specialist, "device: Specialist", spent)
    profile = cProfile.Profile() if args.top else None
    total, tokens, rounds, accepted, drafted = 0.0, 0, 0, 0, 0
    for user in range(args.users):
        shared = load_shared_user(shared_file("email"), user)
        store = HistoryStore(memory=True)
        store.add_many(shared.records)
        client = Client(device, history=store, max_prompt_tokens=args.max_prompt_tokens,
                        companion=lambda: LocalChannel.for_verifier(verifier))
        started = time.perf_counter()
        if profile:
            profile.enable()
        result = client.generate(shared.query, task=shared.task, gamma=args.gamma,
                                 max_new_tokens=args.max_new_tokens, pipeline=False)
        if profile:
            profile.disable()
        total += time.perf_counter() - started
        st = result.stats
        tokens, rounds = tokens + st.tokens, rounds + st.rounds
        accepted, drafted = accepted + st.accepted, drafted + st.drafted
    table = Table(title=f"{args.specialist} -> {args.generalist} ({args.precision}), gamma "
                  f"{args.gamma}: {args.users} users, {tokens} tokens, {rounds} rounds, "
                  f"acceptance {accepted / max(drafted, 1):.0%}")
    for col in ("where", "seconds", "share", "ms per round"):
        table.add_column(col)
    rest = total - sum(spent.values())
    for where, seconds in [*sorted(spent.items()), ("everything else (Python)", rest)]:
        table.add_row(where, f"{seconds:.2f}", f"{seconds / total:.0%}",
                      f"{1e3 * seconds / max(rounds, 1):.1f}")
    table.add_row("total", f"{total:.2f}", "100%",
                  f"{1e3 * total / max(rounds, 1):.1f}")
    Console(width=120).print(table)
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
