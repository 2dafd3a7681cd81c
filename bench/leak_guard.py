"""What drafts copy from the private history, with the leak guard off and on, and what it costs.

For each user of the task (default: the newsgroups senders of the lab's email examples; query
item, gold text, history) one
greedy SpecSteer generation per policy (`allow` = guard off, `redact`, `hold`) through an
in-process companion whose uplink frames are tapped. Counted independently of the guard, from
the decoded frames: drafted tokens that went up and complete a window of `n` token ids found in
the private prompt but not in the public one (per 1,000 drafted tokens sent), the same for every
id sent after the prompt (committed + drafted), and output tokens completing such a window
(per 1,000 output tokens: what the user gets); and spans of `n` words of the private prompt
(not in the public one) in the text sent and in the output, which a copy re-tokenized to dodge the
id windows cannot hide from. Plus ROUGE-1/L against the gold text and tokens/s.

    flock /tmp/specsteer-heavy.lock python bench/leak_guard.py --users 6 --gamma 0.1 \\
        --max-new-tokens 128 --json bench-leak.json

`--data FILE --task topic` runs LaMP/LongLaMP-format rows (`bench/longlamp_topics.py` makes
LongLaMP-4 topic rows from the newsgroups senders). `--skip-unflagged` runs `redact` and `hold`
only for users whose `allow` run flagged something: with nothing flagged the guard changes
nothing and greedy decoding without warm start or pipelining gives the same text, so those rows
are the `allow` row relabelled (`reused`). `--json` is written after every user and a rerun
resumes from it. The report adds each policy's paired 95 % interval of ROUGE-1 against `allow`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specsteer import protocol
from specsteer.device import DecodeStats, Params, decode
from specsteer.device.leak_guard import private_ngrams
from specsteer.link import CompanionLink
from specsteer.models.compile import compile_model
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_lab.eval.data import load_examples
from specsteer_lab.eval.harness import EvalConfig, Harness
from specsteer_lab.eval.metrics import rouge

POLICIES = ("allow", "redact", "hold")


def copied(held: list[int], ids: list[int], private: frozenset[tuple[int, ...]], n: int) -> int:
    """How many of `ids` (appended after `held`) complete a private-only n-gram."""
    run = [*held[-(n - 1):], *ids]
    lead = len(run) - len(ids)
    return sum(tuple(run[lead + j + 1 - n : lead + j + 1]) in private
               for j in range(len(ids)) if lead + j + 1 >= n)


def word_spans(text: str, n: int) -> list[tuple[str, ...]]:
    """Every run of `n` whitespace-separated words: a copy however it was tokenized."""
    words = text.split()
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def sent_ids(frames: list[tuple[str, bytes]]) -> list[int]:
    """The committed and drafted ids that went up, in order (drafts the companion refused too)."""
    ids: list[int] = []
    for direction, frame in frames:
        if direction == "up":
            msg = protocol.decode(frame, protocol.Limits())
            if isinstance(msg, protocol.Draft):
                ids += [*msg.committed_ids, *msg.draft_ids]
    return ids


def audit(frames: list[tuple[str, bytes]], private: frozenset, n: int) -> dict[str, int]:
    """Drafted / all sent ids, and how many of each complete a private n-gram."""
    up = [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "up"]
    down = [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "down"]
    verdicts = iter(m for m in down if isinstance(m, protocol.Verdict))
    counts = dict(drafted=0, drafted_copied=0, sent=0, sent_copied=0)
    held: list[int] = []
    for msg in up:
        if isinstance(msg, protocol.OpenSession):
            held = []  # windows of the output only: the prompt's template is not history
        elif isinstance(msg, protocol.Draft):
            committed, drafts = list(msg.committed_ids), list(msg.draft_ids)
            c_copied = copied(held, committed, private, n)
            held += committed
            d_copied = copied(held, drafts, private, n)
            counts["drafted"] += len(drafts)
            counts["drafted_copied"] += d_copied
            counts["sent"] += len(committed) + len(drafts)
            counts["sent_copied"] += c_copied + d_copied
            held += drafts[: next(verdicts).accepted]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="email",
                        help="email (newsgroups senders), abstract (ACL authors), tweet, ...")
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--gamma", type=float, default=0.1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, default=8, help="window length (Params.leak_guard_n)")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--data", help="a LaMP/LongLaMP-format file instead of the shared set")
    parser.add_argument("--skip-from", type=int, default=0,
                        help="leave out this many first users (run users N+1..N+--users)")
    parser.add_argument("--skip-unflagged", action="store_true",
                        help="reuse the allow row for users it flagged nothing for")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
                        help="the policies to run (allow first: the others pair with it)")
    args = parser.parse_args()

    specialist = load_model(compile_model("qwen2.5-0.5b", args.precision))
    generalist = load_model(compile_model("qwen2.5-1.5b", args.precision))
    harness = Harness(specialist, generalist, EvalConfig(task=args.task))
    rows = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    done = {(r["user"], r["policy"]) for r in rows}
    examples = load_examples(args.task, data=args.data, users=args.skip_from + args.users)
    for example in examples[args.skip_from:]:
        if all((example.user, policy) in done for policy in args.policies):
            continue
        prepared = harness.prepare(example)
        prompt = prepared.device
        private = private_ngrams(prompt.private_ids, prompt.public_ids, args.n)
        decode_text = specialist.tokenizer.decode
        private_words = set(word_spans(decode_text(prompt.private_ids), args.n)) \
            - set(word_spans(decode_text(prompt.public_ids), args.n))
        for policy in args.policies:
            if (example.user, policy) in done:
                continue
            allow = next((r for r in rows if r["user"] == example.user
                          and r["policy"] == "allow"), None)
            if args.skip_unflagged and policy != "allow" and allow and not allow["flagged"]:
                rows.append({**allow, "policy": policy, "reused": True})
                continue
            # no warm start: its switch point depends on when the prefill ends, so the three
            # policies' texts would differ by timing, not by the guard
            params = Params(gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                            pipeline=False, warm_start=False, leak_guard=policy,
                            leak_guard_n=args.n)
            frames: list[tuple[str, bytes]] = []
            link = CompanionLink(LocalChannel.for_verifier(harness.verifier),
                                 tap=lambda d, f, frames=frames: frames.append((d, f)))
            link.hello(generalist_sha256=generalist.sha256,
                       specialist_sha256=specialist.sha256)
            stats = DecodeStats()
            started = time.perf_counter()
            tokens = [e.token for e in decode(specialist, prompt, params, link, stats,
                                              offline="fail")]
            wall = time.perf_counter() - started
            link.close()
            text = specialist.tokenizer.decode(tokens).strip()
            scores = rouge(text, example.gold)
            rows.append(dict(
                user=example.user, policy=policy, tokens=len(tokens), wall_s=wall,
                tokens_per_s=len(tokens) / wall, rouge1=scores.rouge1, rougeL=scores.rougeL,
                output_copied=copied([], tokens, private, args.n),
                flagged=stats.leak_flagged, redacted=stats.leak_redacted, held=stats.leak_held,
                acceptance=stats.acceptance_rate, **audit(frames, private, args.n),
                text=text,
                # n-word spans of the private prompt (not in the public one) in the text that
                # went up and in the output, however tokenized: a re-tokenized copy shows here
                sent_word_spans=sum(w in private_words for w in word_spans(
                    decode_text(sent_ids(frames)), args.n)),
                output_word_spans=sum(w in private_words for w in word_spans(text, args.n)),
            ))
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    report(rows)
    differences(rows)


def differences(rows: list[dict]) -> None:
    """Each policy's ROUGE-1/L minus `allow`'s, paired over users, with a 95 % interval."""
    from specsteer_lab.eval.compare import interval_cell
    from specsteer_lab.quality import paired_bootstrap

    allow = {r["user"]: r for r in rows if r["policy"] == "allow"}
    for policy in POLICIES[1:]:
        mine = {r["user"]: r for r in rows if r["policy"] == policy}
        users = sorted(mine.keys() & allow.keys())
        if not users:
            continue
        for metric in ("rouge1", "rougeL"):
            interval = paired_bootstrap([100 * mine[u][metric] for u in users],
                                        [100 * allow[u][metric] for u in users])
            changed = sum(mine[u]["text"] != allow[u]["text"] for u in users)
            print(f"{policy} - allow {metric}: {interval_cell(interval)} over {len(users)} "
                  f"users ({changed} texts differ)")


def report(rows: list[dict]) -> None:
    table = Table(title="leak guard: copies of private n-grams per 1,000 tokens, and its cost")
    for column in ("policy", "drafted sent", "copied /1k drafted", "copied /1k sent",
                   "copied /1k output", "flagged", "redacted", "held", "ROUGE-1", "ROUGE-L",
                   "tokens/s", "users with copies sent", "8-word spans sent",
                   "8-word spans output"):
        table.add_column(column)
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        if not mine:
            continue
        total = {k: sum(r[k] for r in mine) for k in (
            "drafted", "drafted_copied", "sent", "sent_copied", "tokens", "output_copied",
            "flagged", "redacted", "held", "wall_s")}
        table.add_row(
            policy, str(total["drafted"]),
            f"{1000 * total['drafted_copied'] / max(total['drafted'], 1):.1f}",
            f"{1000 * total['sent_copied'] / max(total['sent'], 1):.1f}",
            f"{1000 * total['output_copied'] / max(total['tokens'], 1):.1f}",
            str(total["flagged"]), str(total["redacted"]), str(total["held"]),
            f"{sum(r['rouge1'] for r in mine) / len(mine):.4f}",
            f"{sum(r['rougeL'] for r in mine) / len(mine):.4f}",
            f"{total['tokens'] / total['wall_s']:.2f}",
            f"{sum(r['sent_copied'] > 0 for r in mine)} of {len(mine)}",
            str(sum(r["sent_word_spans"] for r in mine)),
            str(sum(r["output_word_spans"] for r in mine)),
        )
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
