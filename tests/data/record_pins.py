"""Record decode outputs of the pre-redesign code (run once on commit 130dda1)."""
import json, sys
from specsteer.device import DecodeStats, DevicePrompt, Params, decode
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
        events = list(decode(spec, prompt, params, link if params.method not in ("slm", "slm_rag") else None))
        link.close()
        out.append(dict(params=case, tokens=[e.token for e in events],
                        provenance=[e.provenance for e in events]))
        print(case, len(events), file=sys.stderr)
    return dict(private=PRIVATE, public=PUBLIC, max_new_tokens=max_new, cases=out)

if __name__ == "__main__":
    which = sys.argv[1]
    if which == "tiny":
        spec = load_model(tiny_model_dir("llama", seed=0)); gen = load_model(tiny_model_dir("llama", seed=1))
        res = run(spec, gen, CASES, 40)
        cross = load_model(tiny_model_dir("llama", seed=1, vocab=384))
        res["cross"] = run(spec, cross, [c for c in CASES if c["method"] in ("specsteer", "speculative")], 40)["cases"]
    else:
        from specsteer.models.compile import compile_model
        spec = load_model(compile_model("qwen2.5-0.5b", "int8")); gen = load_model(compile_model("qwen2.5-1.5b", "int8"))
        res = run(spec, gen, [c for c in CASES if c["method"] in ("specsteer", "speculative", "llm")][:5] + [dict(method="llm")], 32)
    json.dump(res, open(sys.argv[2], "w"), indent=1)
