"""Cross-tokenizer SpecSteer on real models: SmolLM2-135M drafting for Qwen2.5-1.5B.

In one run, on the same newsgroups users (their history as private context, prompts built by
`Client.prepare` as in tests/e2e), device and companion on one core each:
  * Qwen2.5-1.5B alone (plain ORT greedy decoding of the public prompt), before and after;
  * SpecSteer SmolLM2-135M -> Qwen2.5-1.5B (different tokenizers: companion text path), and with
    --variants its alternatives (tail back-off instead of the prefix marginal, prefix recovery
    instead of the token distribution, no healing, plain tokenization of the unsettled end);
  * SpecSteer Qwen2.5-0.5B -> Qwen2.5-1.5B (one tokenizer: the token path), same gamma;
  * optionally (--hf) transformers' universal assisted generation: SmolLM2 assisting Qwen 1.5B
    and Qwen 1.5B alone, torch bf16, 1 thread, weights loaded from the cached GGUFs.
Reported: acceptance, ROUGE-L against the user's real post, decode speed in tokens/s and in
bytes/s (tokens differ between tokenizers: bytes of text per second is the fair unit), time to
first token, and for the text path the companion's span statistics and recovery coverage.

    python bench/cross.py --users 3 --max-new-tokens 64 --variants --hf --json bench-cross.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer.runtime import load_model
from specsteer_lab.eval.data import shared_file
from specsteer_lab.eval.metrics import rouge

DEVICE_CORE, COMPANION_CORE = 0, 1
GENERALIST = "qwen2.5-1.5b"


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > core:
        os.sched_setaffinity(0, {core})


# ------------------------------------------------------------------------------ companion


def companion_main(argv: list[str]) -> None:
    """`bench/cross.py companion ...`: a companion that logs each text-path session's stats."""
    import asyncio

    from specsteer_companion.cross import CrossVerifierSession
    from specsteer_companion.server import CompanionServer, ServerConfig
    from specsteer_companion.verifier import Verifier

    ap = argparse.ArgumentParser()
    ap.add_argument("--generalist", default=GENERALIST)
    ap.add_argument("--specialist", required=True)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--specialist-precision")
    ap.add_argument("--tail", default="marginal")
    ap.add_argument("--recovery", default="token")
    ap.add_argument("--heal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--in-context", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--lookahead", type=int, default=0)
    ap.add_argument("--stats", type=Path, required=True)
    args = ap.parse_args(argv)
    g = load_model(args.generalist, precision=args.precision)
    s = load_model(args.specialist, precision=args.specialist_precision or args.precision)

    class Logged:
        """A CrossVerifierSession that appends its stats to a JSON-lines file when closed."""

        def __init__(self, session: CrossVerifierSession) -> None:
            self.session = session
            self.verify, self.row = session.verify, session.row

        def close(self) -> None:
            self.session.close()
            st = self.session.stats
            with open(args.stats, "a") as f:
                f.write(json.dumps({**asdict(st), "coverage": st.coverage}) + "\n")

    class Recording(Verifier):
        def open(self, request, committed=()):  # type: ignore[override]
            if s.tokenizer.vocab_hash != g.tokenizer.vocab_hash:
                return Logged(CrossVerifierSession(self, request, committed=committed,
                                                   tail=args.tail,
                                                   recovery=args.recovery, heal=args.heal,
                                                   in_context=args.in_context,
                                                   lookahead=args.lookahead))
            return super().open(request, committed)

    server = CompanionServer(Recording(g, s), ServerConfig(host="127.0.0.1", port=0, workers=1))
    asyncio.run(server.serve(lambda port: print(f"companion ready: ws://127.0.0.1:{port}",
                                                flush=True)))


def start_companion(specialist: str, precision: str, stats: Path,
                    extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, __file__, "companion", "--specialist", specialist,
           "--precision", precision, "--stats", str(stats), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: _pin(COMPANION_CORE))
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("companion ready:"):
            return proc, line.split()[2]
    raise RuntimeError("companion did not start:\n" + "".join(lines[-20:]))


# ------------------------------------------------------------------------------ measurements


@dataclass
class Run:
    """One generation. Decode speed counts what arrived after the first token."""

    tokens: int
    nbytes: int
    decode_tokens: int
    decode_bytes: int
    decode_s: float  # first to last token
    ttft_s: float
    acceptance: float
    rouge_l: float
    text: str


@dataclass
class Config:
    name: str
    runs: list[Run] = field(default_factory=list)
    companion: list[dict] = field(default_factory=list)

    def summary(self, base_bps: float | None) -> dict:
        runs = self.runs
        decode = sum(r.decode_s for r in runs)
        tok_s = sum(r.decode_tokens for r in runs) / decode if decode else 0.0
        b_s = sum(r.decode_bytes for r in runs) / decode if decode else 0.0
        out = dict(config=self.name, tok_s=tok_s, bytes_s=b_s,
                   speedup=b_s / base_bps if base_bps else None,
                   acceptance=statistics.mean(r.acceptance for r in runs),
                   rouge_l=statistics.mean(r.rouge_l for r in runs),
                   ttft_s=statistics.mean(r.ttft_s for r in runs),
                   tokens=sum(r.tokens for r in runs), nbytes=sum(r.nbytes for r in runs))
        if self.companion:
            c = self.companion
            spans = sum(x["spans"] for x in c)
            out.update(span_pass=sum(x["spans_accepted"] for x in c) / spans if spans else 0.0,
                       tail_share=sum(x["tail_spans"] for x in c) / spans if spans else 0.0,
                       coverage=statistics.mean(x["coverage"] for x in c),
                       uncertain=sum(x["uncertain"] for x in c) / sum(x["recoveries"] for x in c),
                       retokenized=sum(x["retokenized"] for x in c),
                       recovery_pass=sum(x["recovery_passes"] for x in c)
                       / sum(x["recoveries"] for x in c),
                       g_per_round=sum(x["g_tokens"] for x in c) / sum(x["rounds"] for x in c),
                       moved=sum(x["moved"] for x in c) / sum(x["recoveries"] for x in c),
                       examined=sum(x["examined"] for x in c) / sum(x["recoveries"] for x in c))
        return out


def timed_stream(client: Client, user, **params) -> Run:
    stamps: list[float] = []
    first = ""
    started = time.perf_counter()
    stream = client.stream(user.query, task=user.task, warm_start=False, **params)
    for piece in stream:
        stamps.append(time.perf_counter() - started)
        first = first or piece.text
    result = stream.result
    text = result.text
    nbytes = len(text.encode())
    return Run(result.stats.tokens, nbytes, len(stamps) - 1, nbytes - len(first.encode()),
               stamps[-1] - stamps[0] if stamps else 0.0, stamps[0] if stamps else 0.0,
               result.stats.acceptance_rate, rouge(text, user.gold).rougeL, text)


def generalist_alone(model, prompt_ids: list[int], max_new: int, gold: str) -> Run:
    """Plain greedy ORT decoding of the public prompt, one core."""
    session = model.new_session(max_length=len(prompt_ids) + max_new + 8)
    started = time.perf_counter()
    row = session.append(prompt_ids)[-1]
    stamps, out = [], []
    for _ in range(max_new):
        token = int(np.argmax(row))
        if token in model.tokenizer.eos_ids:
            break
        out.append(token)
        stamps.append(time.perf_counter() - started)
        row = session.append([token])[-1]
    session.close()
    text = model.tokenizer.decode(out)
    nbytes = len(text.encode())
    head = len(model.tokenizer.decode(out[:1]).encode())
    return Run(len(out), nbytes, len(out) - 1, nbytes - head, stamps[-1] - stamps[0], stamps[0],
               0.0, rouge(text, gold).rougeL, text)


def public_text(specialist, user, max_prompt_tokens: int) -> tuple[str, Client]:
    store = HistoryStore(memory=True)
    store.add_many(user.records)
    client = Client(specialist, history=store, max_prompt_tokens=max_prompt_tokens)
    _, prompt = client.render(user.query, task=user.task)
    return specialist.tokenizer.decode(list(prompt.public_ids), skip_special=False), client


def hf_assisted(users, prompts: list[str], max_new: int) -> tuple[Config, Config]:
    """transformers universal assisted generation (SmolLM2 -> Qwen 1.5B) and Qwen alone, bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    from specsteer.models.registry import get_spec, gguf_path

    torch.set_num_threads(1)

    def load(name: str):
        path = gguf_path(get_spec(name))
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.bfloat16)
        return tok, model.eval()

    class Stamps(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[tuple[float, int]] = []
            self.started = time.perf_counter()

        def put(self, value) -> None:
            self.times.append((time.perf_counter() - self.started, int(value.numel())))

        def end(self) -> None:
            pass

    q_tok, qwen = load(GENERALIST)
    s_tok, smol = load("smollm2-135m")
    alone, assisted = Config("HF Qwen 1.5B alone (bf16)"), Config("HF UAG SmolLM2 -> Qwen 1.5B")
    for user, text in zip(users, prompts, strict=True):
        ids = q_tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        for config, extra in ((alone, {}), (assisted, dict(assistant_model=smol, tokenizer=q_tok,
                                                            assistant_tokenizer=s_tok))):
            streamer = Stamps()
            with torch.inference_mode():
                out = qwen.generate(ids, max_new_tokens=max_new, do_sample=False,
                                    streamer=streamer, **extra)
            new = out[0, ids.shape[1]:].tolist()
            while new and new[-1] in (q_tok.eos_token_id, q_tok.pad_token_id):
                new.pop()
            gen = q_tok.decode(new, skip_special_tokens=True)
            stamps = streamer.times[1:]  # the first put is the prompt
            first, last = stamps[0][0], stamps[-1][0]
            n_first = stamps[0][1]  # an assisted step can deliver several tokens at once
            nbytes = len(gen.encode())
            head = len(q_tok.decode(new[:n_first], skip_special_tokens=True).encode())
            config.runs.append(Run(len(new), nbytes, len(new) - n_first, nbytes - head,
                                   last - first, first, 0.0, rouge(gen, user.gold).rougeL, gen))
    del qwen, smol
    gc.collect()
    return alone, assisted


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "companion":
        companion_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=3)
    ap.add_argument("--first-user", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--specialist-precision", help="the Specialists', if not --precision's")
    ap.add_argument("--variants", action="store_true",
                    help="also run the text path's alternatives: tail=backoff, "
                         "recovery=prefix, no healing, plain tail tokenization")
    ap.add_argument("--hf", action="store_true", help="add transformers' assisted generation")
    ap.add_argument("--lookahead", type=int, default=0,
                    help="text path: Generalist steps per recovery that measure/resolve the "
                         "one-step mapping (reported as moved/examined mass)")
    ap.add_argument("--ks", type=int, nargs="+", default=[4],
                    help="draft lengths K to run each pair with (one companion per pair)")
    ap.add_argument("--s0-on-device", action="store_true",
                    help="the device sends P_S0 of its drafts (the fast preset's placement)")
    ap.add_argument("--token-pair", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the same-tokenizer Qwen 0.5B -> 1.5B pair")
    ap.add_argument("--adaptive", action="store_true",
                    help="also run each pair with the adaptive draft length (adaptive_k)")
    ap.add_argument("--data", type=Path, help="default: the shared newsgroups set")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.data = args.data or shared_file("email")
    s_precision = args.specialist_precision or args.precision
    _pin(DEVICE_CORE)
    users = [load_shared_user(args.data, args.first_user + i) for i in range(args.users)]
    configs: list[Config] = []
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-cross-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)

    def alone(label: str) -> Config:
        g = load_model(GENERALIST, precision=args.precision)
        smol = load_model("smollm2-135m", precision=s_precision)
        config = Config(f"Qwen 1.5B alone (ORT {args.precision}) {label}")
        for user in users:
            text, _ = public_text(smol, user, args.max_prompt_tokens)
            config.runs.append(generalist_alone(g, g.tokenizer.encode(text),
                                                args.max_new_tokens, user.gold))
        del g, smol
        gc.collect()
        return config

    configs.append(alone("(before)"))
    pairs = [("smollm2-135m", "SmolLM2-135M -> Qwen 1.5B (text path)",
              ["--lookahead", str(args.lookahead)] if args.lookahead else [])]
    if args.variants:
        pairs += [("smollm2-135m", "  tail=backoff", ["--tail", "backoff"]),
                  ("smollm2-135m", "  recovery=prefix", ["--recovery", "prefix"]),
                  ("smollm2-135m", "  no healing", ["--no-heal"]),
                  ("smollm2-135m", "  plain tail tokenization", ["--no-in-context"])]
    if args.token_pair:
        pairs.append(("qwen2.5-0.5b", "Qwen 0.5B -> Qwen 1.5B (token path)", []))
    for specialist_name, label, extra in pairs:
        stats = work / f"{len(configs)}.jsonl"
        proc, url = start_companion(specialist_name, args.precision, stats,
                                    [*extra, "--specialist-precision", s_precision])
        k_label = len(args.ks) > 1 or args.ks != [4] or args.adaptive
        ks: list[int | None] = [*args.ks, *([None] if args.adaptive else [])]
        label += " P_S0 on device" if args.s0_on_device else ""
        pair_configs = [Config(f"{label} g={args.gamma}" + (
            (" adaptive K" if k is None else f" K={k}") if k_label else "")) for k in ks]
        try:
            specialist = load_model(specialist_name, precision=s_precision)
            for user in users:
                store = HistoryStore(memory=True)
                store.add_many(user.records)
                client = Client(specialist, history=store, companion=url,
                                max_prompt_tokens=args.max_prompt_tokens)
                for k, config in zip(ks, pair_configs, strict=True):
                    sizing = dict(adaptive_k=True) if k is None else dict(k=k)
                    run = timed_stream(client, user, gamma=args.gamma, **sizing,
                                       s0_on_device=args.s0_on_device,
                                       max_new_tokens=args.max_new_tokens, offline="fail")
                    config.runs.append(run)
                    rate = run.decode_bytes / max(run.decode_s, 1e-9)
                    print(f"{config.name}: {run.tokens} tokens, {rate:.1f} B/s, acceptance "
                          f"{run.acceptance:.0%}, ROUGE-L {run.rouge_l:.3f}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
        if stats.exists() and len(pair_configs) == 1:  # companion stats are per process
            pair_configs[0].companion = [json.loads(x) for x in stats.read_text().splitlines() if x]
        configs.extend(pair_configs)
        del specialist
        gc.collect()
    configs.append(alone("(after)"))
    if args.hf:
        smol = load_model("smollm2-135m", precision=s_precision)
        prompts = [public_text(smol, user, args.max_prompt_tokens)[0] for user in users]
        del smol
        configs.extend(hf_assisted(users, prompts, args.max_new_tokens))
    base = statistics.mean(c.summary(None)["bytes_s"] for c in configs[:1] + [
        c for c in configs if c.name.endswith("(after)")])
    hf_base = next((c.summary(None)["bytes_s"] for c in configs if c.name.startswith("HF Qwen")),
                   None)
    rows = []
    for c in configs:
        row = c.summary(hf_base if c.name.startswith("HF") else base)
        rows.append(row)
    header = ["config", "tok/s", "bytes/s", "speed-up", "acceptance", "ROUGE-L", "TTFT s",
              "span pass", "coverage"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        cells = [r["config"], _fmt(r["tok_s"], ".2f"), _fmt(r["bytes_s"], ".1f"),
                 _fmt(r["speedup"], ".2f", "x"), _fmt(r["acceptance"], ".0%"),
                 _fmt(r["rouge_l"], ".3f"), _fmt(r["ttft_s"], ".2f"),
                 _fmt(r.get("span_pass"), ".0%"), _fmt(r.get("coverage"), ".3f")]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": platform.platform(), "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows, "runs": {c.name: [asdict(r) for r in c.runs] for c in configs},
            "companion": {c.name: c.companion for c in configs if c.companion}}, indent=2))


if __name__ == "__main__":
    main()
