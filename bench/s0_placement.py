"""Where P_S0 runs when the Generalist is on vLLM: three placements, measured side by side.

P_S0 is the context-free copy of the device's Specialist: its log-probabilities of the drafted
ids (the ratio test) and at the Generalist's candidates (recovery). With the Generalist on a
vLLM engine it can be computed
  - `companion-onnx`: by the companion, on the ONNX Runtime copy of the device's very artifact
    (`serve --generalist-engine vllm --specialist NAME`, the default),
  - `device`: by the device, on a second session of its own Specialist without the history
    (`s0_on_device=True`, or a companion started with `--specialist none`),
  - `companion-vllm`: by a second vLLM engine in the companion (the 0.5B's `export-hf` folder,
    bf16): the engine returns the drafted ids' log-probabilities with the round, and those at
    the Generalist's candidates in one more request per round (`logprob_token_ids`). Not the
    device's artifact, so a device that pins its Specialist's hash is refused by such a
    companion (the bench skips that check); measured to decide, not shipped as an option.
For each of `--users` email senders one greedy generation per placement runs through an
in-process companion (device and companion in this process, one after the other, so the
split of the time between them is exact): reported per placement are the device's and the
companion's seconds per round, tokens/s, and whether the text equals `companion-onnx`'s.

    flock /tmp/specsteer-heavy.lock python bench/s0_placement.py --users 4 \\
        --json /tmp/s0-placement.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specsteer.device import DecodeStats, Params, decode
from specsteer.link import CompanionLink
from specsteer.models.compile import compile_model
from specsteer.models.export_hf import hf_dir
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier
from specsteer_companion.vllm_engine import VllmOptions, VllmScoring
from specsteer_lab.eval.data import load_examples
from specsteer_lab.eval.harness import EvalConfig, Harness

PLACEMENTS = ("companion-onnx", "device", "companion-vllm")


def run(specialist, verifier: Verifier, prompt, params: Params) -> dict:
    link = CompanionLink(LocalChannel.for_verifier(verifier))
    link.hello()  # no artifact pinning: the vLLM copy of P_S0 is another artifact
    hello_wait = link.stats.wait_s  # the link counts its waits (LinkStats), the loop its own
    stats = DecodeStats()
    started = time.perf_counter()
    tokens = [e.token for e in decode(specialist, prompt, params, link, stats, offline="fail")]
    wall = time.perf_counter() - started
    link.close()
    rounds = max(stats.rounds, 1)
    return dict(tokens=tokens, wall_s=wall, rounds=stats.rounds,
                device_ms_per_round=1e3 * stats.device_s / rounds,
                companion_ms_per_round=1e3 * (link.stats.wait_s - hello_wait) / rounds,
                tokens_per_s=len(tokens) / wall, acceptance=stats.acceptance_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--task", default="email")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    specialist = load_model(compile_model("qwen2.5-0.5b", "int8"))
    generalist = load_model(compile_model("qwen2.5-1.5b", "int8"))  # prompts only
    g = VllmScoring(VllmOptions(model=str(hf_dir("qwen2.5-1.5b")), dtype="bfloat16",
                                kv_cache_gib=args.kv_cache_gib))
    s0 = VllmScoring(VllmOptions(model=str(hf_dir("qwen2.5-0.5b")), dtype="bfloat16",
                                 kv_cache_gib=args.kv_cache_gib / 2))
    verifiers = {"companion-onnx": Verifier(g, specialist), "device": Verifier(g, None),
                 "companion-vllm": Verifier(g, s0)}
    harness = Harness(specialist, generalist, EvalConfig(task=args.task))
    rows = []
    try:
        for example in load_examples(args.task, users=args.users):
            prompt = harness.prepare(example).device
            first = None
            for placement in PLACEMENTS:
                params = Params(max_new_tokens=args.max_new_tokens, pipeline=False,
                                warm_start=False, s0_on_device=placement == "device")
                got = run(specialist, verifiers[placement], prompt, params)
                first = first or got["tokens"]
                row = dict(user=example.user, placement=placement,
                           same_text=got["tokens"] == first,
                           **{k: v for k, v in got.items() if k != "tokens"})
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        g.close()
        s0.close()
    for placement in PLACEMENTS:
        mine = [r for r in rows if r["placement"] == placement]
        n = len(mine)
        print(f"{placement:>15}: device {sum(r['device_ms_per_round'] for r in mine) / n:6.0f} "
              f"ms/round, companion {sum(r['companion_ms_per_round'] for r in mine) / n:6.0f} "
              f"ms/round, {sum(r['tokens_per_s'] for r in mine) / n:5.2f} tok/s, same text as "
              f"companion-onnx {sum(r['same_text'] for r in mine)}/{n}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
