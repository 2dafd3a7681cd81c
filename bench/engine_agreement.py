"""The Generalist on vLLM against ONNX Runtime: the same drafts, the same verdicts?

Real generations of the Qwen pair (device Specialist 0.5B int8, in-process companion on ONNX
Runtime: Generalist 1.5B int8, P_S0 the device's artifact) are recorded round by round from
their frames (committed ids, draft, verdict). Each recorded session is then replayed on fresh
scoring sessions of both Generalist engines — ONNX Runtime (the recorded precision) and vLLM
(an `export-hf` folder, bf16 by default) — following the recorded trajectory, with the same
P_S0 from the ONNX Runtime copy. Reported per drafted token: whether the ratio test
`P_G(y) >= gamma * P_S0(y)` gives the same answer on both engines; per round: the same accepted
count, and the same first recovery candidate (top-1 of logp_G at the round's recovery row).
Also each engine's round time over the replay (ONNX Runtime one session at a time, vLLM one
request at a time: no batching in this bench).

    flock /tmp/specsteer-heavy.lock python bench/engine_agreement.py --users 6 \\
        --tasks email abstract tweet --json /tmp/agreement.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specsteer import protocol
from specsteer.device import DecodeStats, Params, decode
from specsteer.link import CompanionLink
from specsteer.models.compile import compile_model
from specsteer.models.export_hf import hf_dir
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.scoring import TrackScoring
from specsteer_companion.vllm_engine import VllmOptions, VllmScoring
from specsteer_lab.eval.data import load_examples
from specsteer_lab.eval.harness import EvalConfig, Harness


@dataclass
class Round:
    committed: list[int]
    draft: list[int]
    accepted: int


def record(harness: Harness, prepared, params: Params) -> tuple[list[int], list[Round]]:
    """One generation through the ONNX Runtime companion: its public prompt and its rounds."""
    frames: list[tuple[str, bytes]] = []
    link = CompanionLink(LocalChannel.for_verifier(harness.verifier),
                         tap=lambda d, f: frames.append((d, f)))
    link.hello(generalist_sha256=harness.generalist.sha256,
               specialist_sha256=harness.specialist.sha256)
    list(decode(harness.specialist, prepared.device, params, link, DecodeStats(),
                offline="fail"))
    link.close()
    decoded = [(d, protocol.decode(f, protocol.Limits())) for d, f in frames]
    prompt = next(m.prompt_ids for d, m in decoded if isinstance(m, protocol.OpenSession))
    drafts = [m for d, m in decoded if isinstance(m, protocol.Draft)]
    verdicts = [m for d, m in decoded if isinstance(m, protocol.Verdict)]
    rounds = [Round(list(d.committed_ids), list(d.draft_ids), v.accepted)
              for d, v in zip(drafts, verdicts, strict=True)]
    return list(prompt), rounds


def replay(engine, s0: TrackScoring, prompt: list[int], rounds: list[Round], gamma: float,
           top_k: int) -> dict:
    """Per drafted token the ratio test's answer, per round the accepted count and top-1."""
    g = engine.open(prompt, max_length=4096, temperature=1.0, owner="bench")
    s = s0.open(prompt, max_length=4096, temperature=1.0)
    passes, accepted, top1, seconds = [], [], [], []
    for r in rounds:
        seq, offset = [*r.committed, *r.draft], len(r.committed)
        started = time.perf_counter()
        scores = g.score(seq, offset, top_k)
        lg = scores.taken()
        seconds.append(time.perf_counter() - started)
        ls0 = s.score(seq, offset, 0).taken()
        ok = lg >= np.log(gamma) + ls0
        passes.append(ok.tolist())
        accepted.append(int(np.argmin(ok)) if not ok.all() else len(ok))
        top1.append(int(scores.top(offset + r.accepted, 1)[0][0]))
        g.keep(offset + r.accepted)  # both follow the recorded trajectory
        s.keep(offset + r.accepted)
    g.close()
    s.close()
    return {"passes": passes, "accepted": accepted, "top1": top1, "seconds": seconds}


def _same(a: list[int], b: list[int]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["email", "abstract", "tweet"])
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=float, default=0.5)
    parser.add_argument("--precision", default="int8", help="the ONNX Runtime models'")
    parser.add_argument("--dtype", default="bfloat16", help="the vLLM Generalist's folder")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    specialist = load_model(compile_model("qwen2.5-0.5b", args.precision))
    generalist = load_model(compile_model("qwen2.5-1.5b", args.precision))
    engine = VllmScoring(VllmOptions(model=str(hf_dir("qwen2.5-1.5b", args.dtype)),
                                     dtype=args.dtype, kv_cache_gib=args.kv_cache_gib))
    ort, s0 = TrackScoring(generalist), TrackScoring(specialist)
    params = Params(gamma=args.gamma, max_new_tokens=args.max_new_tokens, pipeline=False,
                    warm_start=False)
    rows = []
    try:
        for task in args.tasks:
            harness = Harness(specialist, generalist, EvalConfig(task=task))
            for example in load_examples(task, users=args.users):
                prompt, rounds = record(harness, harness.prepare(example), params)
                a = replay(ort, s0, prompt, rounds, args.gamma, params.top_k)
                b = replay(engine, s0, prompt, rounds, args.gamma, params.top_k)
                recorded = [r.accepted for r in rounds]
                pairs = [(x, y) for pa, pb in zip(a["passes"], b["passes"], strict=True)
                         for x, y in zip(pa, pb, strict=True)]
                row = dict(task=task, user=example.user, rounds=len(rounds),
                           drafted=len(pairs), same_token=sum(x == y for x, y in pairs),
                           same_accepted=_same(a["accepted"], b["accepted"]),
                           ort_matches_record=a["accepted"] == recorded,
                           same_top1=_same(a["top1"], b["top1"]),
                           ort_round_ms=1e3 * statistics.median(a["seconds"]),
                           vllm_round_ms=1e3 * statistics.median(b["seconds"]))
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        engine.close()
    total = {k: sum(r[k] for r in rows) for k in ("drafted", "same_token", "rounds",
                                                    "same_accepted", "same_top1")}
    print(f"ratio test, same answer: {total['same_token']}/{total['drafted']} drafted tokens "
          f"({100 * total['same_token'] / max(total['drafted'], 1):.1f} %); same accepted count "
          f"{total['same_accepted']}/{total['rounds']} rounds; same top-1 recovery candidate "
          f"{total['same_top1']}/{total['rounds']}; engine stats {engine.stats}")
    print(f"median round: ONNX Runtime {statistics.median(r['ort_round_ms'] for r in rows):.0f} "
          f"ms, vLLM {statistics.median(r['vllm_round_ms'] for r in rows):.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
