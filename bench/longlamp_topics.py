"""LongLaMP-4 ("topic": a Reddit post from its summary) rows made from the newsgroups senders.

LongLaMP's own rows are not obtainable here (no hub). A newsgroup post is the same kind of text
— a writer's post to a topic forum under a one-line summary — so each sender becomes one
LongLaMP-4 item: `input` is LongLaMP's instruction with the query post's subject as the
summary, `output` its body, and `profile` the sender's earlier posts as {summary, content}
(the fields `specsteer-lab eval --task topic --data FILE` reads). Bodies are kept as the
shared set has them; the eval's loader and prompts treat them as they treat LongLaMP's.

    python bench/longlamp_topics.py --skip 20 --users 20 --out /tmp/topics.json
    python bench/leak_guard.py --task topic --data /tmp/topics.json --users 20 ...

The file holds research data (20 Newsgroups): never ship it; it is written outside the repo.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specsteer.history.shared import read_shared
from specsteer_lab.eval.data import shared_file

INSTRUCTION = 'Generate the content for a reddit post "{summary}"'


def topic_rows(skip: int, users: int) -> list[dict]:
    _, senders = read_shared(shared_file("email"))
    rows = []
    for sender in senders[skip: skip + users]:
        post = sender["query"]
        rows.append({
            "id": f"newsgroups-topic:{post['id']}",
            "user_id": sender["user"],
            "input": INSTRUCTION.format(summary=post["subject"]),
            "output": post["body"],
            "profile": [{"id": item["id"], "summary": item["subject"], "content": item["body"]}
                        for item in sender["profile"] if item["id"] != post["id"]],
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N senders")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = topic_rows(args.skip, args.users)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} LongLaMP-4 topic rows -> {args.out}")


if __name__ == "__main__":
    main()
