"""What the Specialist's examples look like under a prompt budget: how many, how long, how clean.

For the first N users of a shared task: retrieve the BM25 top-k records as the harness does and
build the private prompt with the model's own tokenizer (no model is loaded) at each budget and
each `min_example_tokens`. Reported per setting: examples per user, the median tokens of an
example text, how many example texts still open with a quote or an attribution, and how many of
the retrieved records' raw bodies did (what the examples showed before `own_words`). Answers
"fewer, longer examples or more, shorter ones" without spending model time.

    python bench/prompt_shapes.py --task email --users 20 --budgets 768 1024 --floors 0 96 160
"""

from __future__ import annotations

import argparse
import statistics

from specsteer.history import prompts
from specsteer.history.store import HistoryStore
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.tokenizer import Tokenizer
from specsteer_lab.eval.data import load_examples

QUOTE_OPENINGS = (">", "In article")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="email")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--retrieve-k", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="+", default=[768, 1024])
    parser.add_argument("--floors", type=int, nargs="+", default=[0, 96, 160])
    parser.add_argument("--model", default="qwen2.5-0.5b",
                        help="whose tokenizer counts tokens (a compiled int8 registry model)")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_folder(compiled_dir(get_spec(args.model), "int8"))
    examples = load_examples(args.task, None, args.users)
    hits = {}
    for example in examples:
        store = HistoryStore(memory=True)
        store.add_many(example.records)
        hits[example.user] = prompts.retrieve(store, args.task, example.query, args.retrieve_k,
                                              before=example.before)
        store.close()
    raw = [hit.record.body for found in hits.values() for hit in found]
    raw_quoted = sum(body.lstrip().startswith(QUOTE_OPENINGS) for body in raw)
    print(f"{args.task}, {len(examples)} users, top-{args.retrieve_k}: {raw_quoted}/{len(raw)} "
          "retrieved raw bodies open with a quote or an attribution")
    print("| budget | min_example_tokens | examples / user | tokens / example (median) "
          "| examples opening with a quote |")
    print("|---|---|---|---|---|")
    for budget in args.budgets:
        for floor in args.floors:
            counts, sizes, quoted = [], [], 0
            for example in examples:
                prompt = prompts.build_prompt(
                    args.task, example.query, hits[example.user], count_tokens=tokenizer.count,
                    max_prompt_tokens=budget, min_example_tokens=floor)
                counts.append(len(prompt.examples))
                sizes += [tokenizer.count(answer) for _, answer in prompt.examples]
                quoted += sum(answer.lstrip().startswith(QUOTE_OPENINGS)
                              for _, answer in prompt.examples)
            print(f"| {budget} | {floor} | {statistics.mean(counts):.2f} "
                  f"| {statistics.median(sizes) if sizes else 0:.0f} | {quoted}/{len(sizes)} |")


if __name__ == "__main__":
    main()
