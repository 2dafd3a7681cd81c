"""Record decode outputs of the pre-redesign code (run on commit 130dda1; kept for audit).

    PYTHONPATH=<old checkout>/sdk:<old checkout>/cloud_companion python record_pins.py tiny OUT
"""
import json
import sys

from specsteer.device import DevicePrompt, Params, decode
from specsteer.link import CompanionLink
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

PRIVATE = ("Earlier notes by this user: the budget for next quarter stays flat; I will send the "
           "revised draft by Friday. Thanks, Sam.\nWrite a note about the budget for next quarter.")
PUBLIC = "Write a note about the budget for next quarter."
CASES = [
    dict(method="specsteer"),
    dict(method="specsteer", gamma=0.1, top_k=32),
    dict(method="specsteer", s0_on_device=True),
    dict(method="specsteer", pipeline=False),
    dict(method="specsteer", select="difference"),
    dict(method="specsteer", top_p=0.9),
    dict(method="specsteer", temperature=0.8, seed=3),
    dict(method="specsteer", temperature=0.8, seed=3, s0_on_device=True),
    dict(method="speculative"),
    dict(method="llm"),
    dict(method="light_costeer"),
    dict(method="costeer"),
    dict(method="slm"),
    dict(method="slm_rag"),
]

def run(spec, gen, cases, max_new):
    tok = spec.tokenizer
    prompt = DevicePrompt(tok.encode(PRIVATE), tok.encode(PUBLIC))
    out = []
    for case in cases:
        params = Params(max_new_tokens=max_new, **case)
        verifier = Verifier(gen, spec)
        link = CompanionLink(LocalChannel.for_verifier(verifier))
        link.hello()
        local_only = params.method in ("slm", "slm_rag")
        events = list(decode(spec, prompt, params, None if local_only else link))
        link.close()
        out.append(dict(params=case, tokens=[e.token for e in events],
                        provenance=[e.provenance for e in events]))
        print(case, len(events), file=sys.stderr)
    return dict(private=PRIVATE, public=PUBLIC, max_new_tokens=max_new, cases=out)

if __name__ == "__main__":
    which = sys.argv[1]
    if which == "tiny":
        spec = load_model(tiny_model_dir("llama", seed=0))
        gen = load_model(tiny_model_dir("llama", seed=1))
        res = run(spec, gen, CASES, 40)
        cross = load_model(tiny_model_dir("llama", seed=1, vocab=384))
        steered = [c for c in CASES if c["method"] in ("specsteer", "speculative")]
        res["cross"] = run(spec, cross, steered, 40)["cases"]
    else:
        from specsteer.models.compile import compile_model
        spec = load_model(compile_model("qwen2.5-0.5b", "int8"))
        gen = load_model(compile_model("qwen2.5-1.5b", "int8"))
        real = [c for c in CASES if c["method"] in ("specsteer", "speculative", "llm")]
        real = [c for c in real if ("top_p" not in c and "s0_on_device" not in c) or len(c) == 2]
        res = run(spec, gen, real, 32)
    with open(sys.argv[2], "w") as f:
        json.dump(res, f, indent=1)
