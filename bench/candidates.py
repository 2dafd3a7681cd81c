"""How many recovery candidates does SpecSteer need? The rank of each fused choice in logp_G.

Greedy recovery picks argmax(logp_G - alpha*logp_S0 + alpha*logp_Sc) over the top-k ids of
logp_G. A smaller k gives exactly the same token whenever the token chosen with k=64 ranks
within the smaller k, so the rank of every fused choice decides, position by position, whether
a cheaper candidate set (fewer bytes on the wire) would have changed the text.

For each newsgroups sender: a greedy SpecSteer generation with an in-process companion (the
same frames as the network) at top_k=64, then one teacher-forced pass per distribution over
its tokens (logp_G and logp_S0 on the public prompt, logp_Sc on the private one) to recompute
every recovered / bonus position with `specsteer.steer`'s own functions. Reported: the rank
distribution of the chosen tokens, how often each smaller k picks the same token, and how
many users' texts each k leaves unchanged (no differing position).

    python bench/candidates.py --users 10 --precision w8a8 --gamma 0.1 --json bench-cand.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from specsteer import steer
from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier
from specsteer_lab.eval.data import shared_file

SMALLER_KS = (8, 16, 24, 32, 48)
FUSED = ("recovered", "bonus")


def forced_logp(model, prefix: list[int], tokens: list[int]) -> np.ndarray:
    """log-softmax rows predicting each of `tokens` after `prefix`: [len(tokens), V]."""
    session = model.new_session(max_length=len(prefix) + len(tokens) + 8)
    try:
        first = session.append(prefix)[-1:]
        rest = session.append(tokens[:-1]) if len(tokens) > 1 else first[:0]
    finally:
        session.close()
    return steer.log_softmax(np.concatenate([first, rest]))


def fused_scores(lg: np.ndarray, ls0: np.ndarray, lsc: np.ndarray, k: int,
                 alpha: float) -> tuple[int, dict[int, float]]:
    """The device's greedy recovery over the top-k of logp_G, exactly as device.py does it:
    the chosen id, and the fused score of every candidate."""
    sparse = steer.sparse_steer(lg, ls0, alpha, k)
    scores = steer.fuse(sparse, lsc, alpha)
    by_id = dict(zip(sparse.ids.tolist(), scores.tolist(), strict=True))
    return steer.pick(sparse.ids, scores), by_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--generalist", default="qwen2.5-1.5b")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--first-user", type=int, default=0)
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(width=140)
    specialist = load_model(args.specialist, precision=args.precision)
    generalist = load_model(args.generalist, precision=args.precision)
    verifier = Verifier(generalist, specialist)
    data = shared_file("email")
    ranks: list[int] = []
    same = {k: 0 for k in SMALLER_KS}
    unchanged_users = {k: 0 for k in SMALLER_KS}
    mismatched_replays: list[dict] = []
    replayed = 0
    per_user = []
    for user in range(args.first_user, args.first_user + args.users):
        started = time.perf_counter()
        shared = load_shared_user(data, user)
        store = HistoryStore(memory=True)
        store.add_many(shared.records)
        client = Client(specialist, history=store, max_prompt_tokens=args.max_prompt_tokens,
                        companion=lambda: LocalChannel.for_verifier(verifier))
        result = client.generate(shared.query, task=shared.task, gamma=args.gamma,
                                 alpha=args.alpha, max_new_tokens=args.max_new_tokens,
                                 warm_start=False)
        if result.stats.degraded:
            raise SystemExit(f"user {user}: generation degraded ({result.stats.offline_reason})")
        _, prompt = client.render(shared.query, task=shared.task)
        tokens = result.tokens
        lg = forced_logp(generalist, list(prompt.public_ids), tokens)
        ls0 = forced_logp(specialist, list(prompt.public_ids), tokens)
        lsc = forced_logp(specialist, list(prompt.private_ids), tokens)
        user_ranks, differs = [], {k: False for k in SMALLER_KS}
        for i, origin in enumerate(result.provenance):
            if origin not in FUSED:
                continue
            order = np.argsort(-lg[i], kind="stable")
            user_ranks.append(int(np.flatnonzero(order == tokens[i])[0]) + 1)
            replay, scores = fused_scores(lg[i], ls0[i], lsc[i], 64, args.alpha)
            if replay != tokens[i]:  # batched vs incremental numerics: report, don't compare
                # how far the replay's pick beats the generation's token in fused log-score
                margin = scores[replay] - scores.get(tokens[i], -np.inf)
                mismatched_replays.append(dict(user=user, position=i, origin=origin,
                                               margin=margin))
                continue
            replayed += 1
            for k in SMALLER_KS:
                if fused_scores(lg[i], ls0[i], lsc[i], k, args.alpha)[0] == tokens[i]:
                    same[k] += 1
                else:
                    differs[k] = True
        ranks += user_ranks
        for k in SMALLER_KS:  # a rank beyond k anywhere (replayed or not) changes the text
            unchanged_users[k] += not differs[k] and max(user_ranks, default=0) <= k
        per_user.append(dict(user=shared.user, tokens=len(tokens), fused=len(user_ranks),
                             max_rank=max(user_ranks, default=0)))
        console.print(f"user {user} ({shared.user}): {len(tokens)} tokens, {len(user_ranks)} "
                      f"fused positions, max rank {max(user_ranks, default=0)} "
                      f"({time.perf_counter() - started:.0f} s)")
    n = len(ranks)
    table = Table(title=f"{args.specialist} -> {args.generalist} ({args.precision}), gamma "
                  f"{args.gamma}, {args.users} users x {args.max_new_tokens} tokens: {n} fused "
                  f"positions")
    for col in ("top_k", "chosen token ranks within", "same token as top-64 (replayed)",
                "users with unchanged text"):
        table.add_column(col)
    summary = []
    for k in SMALLER_KS:
        within = sum(r <= k for r in ranks)
        summary.append(dict(k=k, within=within, same=same[k], users=unchanged_users[k]))
        table.add_row(str(k), f"{within}/{n} ({within / max(n, 1):.1%})",
                      f"{same[k]}/{replayed} ({same[k] / max(replayed, 1):.1%})",
                      f"{unchanged_users[k]}/{args.users}")
    console.print(table)
    console.print(f"rank of the chosen token in logp_G: median {np.median(ranks):.0f}, "
                  f"p99 {np.percentile(ranks, 99):.0f}, max {max(ranks)}; replays that did "
                  f"not reproduce the top-64 choice (numerics): {len(mismatched_replays)} "
                  f"{mismatched_replays}")
    if args.json:
        args.json.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()},
                                             ranks=ranks, summary=summary, users=per_user,
                                             mismatched_replays=mismatched_replays), indent=2))


if __name__ == "__main__":
    main()
