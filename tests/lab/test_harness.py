"""The evaluation harness on tiny models: data loading, every method, wire accounting, resume,
emulated RTT and the report."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from specsteer_lab.eval import data as data_lib
from specsteer_lab.eval.data import EvalError, load_examples, load_lamp
from specsteer_lab.eval.harness import (
    DEFAULT_METHODS,
    EvalConfig,
    Harness,
    parse_method,
    parse_methods,
    read_results,
    run_eval,
)
from specsteer_lab.eval.metrics import rouge
from specsteer_lab.eval.report import plot_quality_vs_speed, render_report, summarize

# every method through the harness on tiny models, many times: not in ./dev test --fast
pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
REVIEWS = DATA / "lamp_reviews.jsonl"
NEWSGROUPS = DATA / "newsgroups_slice.json"


@pytest.fixture(scope="module")
def reviews() -> list[data_lib.Example]:
    return load_lamp(REVIEWS, "review")


@pytest.fixture(scope="module")
def harness(tiny_model, tiny_generalist) -> Harness:
    return Harness(tiny_model, tiny_generalist, EvalConfig.of("review", max_new_tokens=6,
                                                           retrieve_k=2))


# ------------------------------------------------------------------------------------ data

def test_lamp_jsonl_loader_maps_input_and_profile(reviews):
    first = reviews[0]
    assert [e.user for e in reviews] == ["A2KETTLE", "B7BOOKS"]
    assert first.task == "review"
    assert first.query == {
        "description": "Stainless steel electric kettle, 1.7 litre, auto shut-off",
        "rating": "5.0",
        "summary": "Boils water fast and quietly",
    }
    assert first.gold.startswith("This kettle boils a full litre")
    # the empty profile item is skipped; the others are reviews with product and rating kept
    assert len(first.records) == 3
    kettle = next(r for r in first.records if r.id == "review:A2KETTLE:p3")
    assert kettle.kind == "review"
    assert kettle.title == "Electric kettle, plastic body, 1 litre"
    assert kettle.body.startswith("The kettle smells of plastic")
    assert kettle.meta == {"overall": "2.0", "summary": "Smells of plastic"}
    assert all(first.gold not in r.body for r in first.records)


def test_lamp_loader_limits_users_and_rejects_unknown_task(tmp_path):
    assert len(load_lamp(REVIEWS, "review", users=1)) == 1
    with pytest.raises(EvalError, match="not supported"):
        load_lamp(REVIEWS, "poetry")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "1", "input": "x"}\n')
    with pytest.raises(EvalError, match="lacks"):
        load_lamp(broken, "tweet")


def test_lamp_loader_reads_a_json_list_and_reports_bad_lines(tmp_path):
    listed = tmp_path / "reviews.json"  # the same items as one JSON list
    listed.write_text(json.dumps([json.loads(line) for line in REVIEWS.read_text().splitlines()
                                  if line.strip()]))
    assert load_lamp(listed, "review") == load_lamp(REVIEWS, "review")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(REVIEWS.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(EvalError, match=r"bad.jsonl:2: not valid JSON"):
        load_lamp(bad, "review")
    with pytest.raises(EvalError, match="cannot read"):
        load_lamp(tmp_path / "missing.jsonl", "review")


@pytest.mark.parametrize(("task", "item_input", "profile", "query", "record"), [
    ("tweet", "Paraphrase the following tweet without any explanation before or after it: "
              "so tired of mondays", [{"id": "1", "text": "coffee first"}],
     {"tweet": "Paraphrase the following tweet without any explanation before or after it: "
               "so tired of mondays"}, ("tweet", "", "coffee first")),
    ("title", "Generate a title for the following abstract of a paper: We study retrieval.",
     [{"id": "7", "title": "Old paper", "abstract": "Old abstract."}],
     {"abstract": "We study retrieval."}, ("paper", "Old paper", "Old abstract.")),
    ("abstract", 'Generate an abstract for the title "Steering small models" using the '
                 "following items: 1. decoding 2. privacy",
     [{"id": "8", "title": "Earlier", "abstract": "An abstract."}],
     {"title": "Steering small models"}, ("paper", "Earlier", "An abstract.")),
    ("topic", 'Generate the content for a reddit post "My first marathon"',
     [{"id": "9", "summary": "Training log", "content": "Ran 20 km today."}],
     {"summary": "My first marathon"}, ("post", "Training log", "Ran 20 km today.")),
])
def test_lamp_inputs_per_task(tmp_path, task, item_input, profile, query, record):
    path = tmp_path / "items.json"
    path.write_text(json.dumps([{"id": "u1", "input": item_input, "output": "gold",
                                 "profile": profile}]))
    (example,) = load_lamp(path, task)
    assert example.query == query
    assert (example.records[0].kind, example.records[0].title, example.records[0].body) == record


def test_shared_format_file_goes_through_the_shared_loader():
    examples = load_examples("email", NEWSGROUPS)
    assert [e.user for e in examples] == ["ada@example.org (Ada Lane)",
                                          "bob@example.net (Bob Reyes)"]
    assert examples[0].query == {"subject": "Re: Launch window for the Mars probe",
                                 "newsgroup": "sci.space"}
    assert examples[0].gold.startswith("The launch window opens")
    assert len(examples[0].records) == 3
    with pytest.raises(EvalError, match="newsgroups data set"):
        load_examples("abstract", NEWSGROUPS)


def test_shared_data_sets_by_task(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSTEER_DATA_DIR", str(tmp_path))
    (tmp_path / data_lib.SHARED_FILES["email"]).write_text(NEWSGROUPS.read_text())
    assert len(load_examples("email", users=1)) == 1
    with pytest.raises(EvalError, match="no shared data set"):
        load_examples("review")


# --------------------------------------------------------------------------------- methods

def test_method_names():
    assert parse_method("specsteer@0.1").gamma == pytest.approx(0.1)
    assert parse_method("specsteer").label == "specsteer@0.5"
    assert parse_method("specsteer@1").label == "specsteer@1.0"
    assert parse_method("costeer").method == "costeer"
    assert [s.label for s in parse_methods(["slm,llm", "slm", "specsteer@0.50"])] == [
        "slm", "llm", "specsteer@0.5"]
    for bad in ("gpt", "costeer@0.5", "specsteer@x", "llm:fast", "specsteer:turbo"):
        with pytest.raises(EvalError):
            parse_method(bad)


def test_a_preset_method_decodes_with_the_presets_settings():
    from specsteer.settings import Params

    fast = parse_method("specsteer:fast")
    preset = Params.preset("fast")
    assert (fast.label, fast.method, fast.gamma, fast.top_k) == (
        "specsteer:fast", "specsteer", preset.gamma, preset.top_k)
    config = EvalConfig.of("tweet", top_k=64)
    assert config.params(fast).top_k == preset.top_k != 64
    assert config.params(parse_method("specsteer@0.1")).top_k == 64  # the run's own
    assert [s.label for s in parse_methods(["specsteer:fast", "specsteer@0.1"])] == [
        "specsteer:fast", "specsteer@0.1"]  # same gamma, two methods


def test_no_repeat_rule_reaches_every_method():
    from specsteer.settings import Params

    assert EvalConfig.of("tweet").decoding.no_repeat_ngram == Params().no_repeat_ngram
    assert EvalConfig.of("tweet").decoding.loop_ngram == Params().loop_ngram
    assert EvalConfig.of("tweet").decoding.loop_end_ngram == Params().loop_end_ngram
    config = EvalConfig.of("tweet", no_repeat_ngram=6, loop_ngram=3, loop_end_ngram=5)
    for name in ("slm_rag", "llm", "specsteer@0.5", "specsteer:fast"):
        params = config.params(parse_method(name))
        assert (params.no_repeat_ngram, params.loop_ngram, params.loop_end_ngram) == (6, 3, 5)
    with pytest.raises(EvalError, match="loop_end_ngram"):
        EvalConfig.of("tweet", loop_end_ngram=1)


def test_end_release_and_meta_openings_reach_every_method():
    from specsteer.meta_answers import ASSISTANT_OPENINGS, ASSISTANT_PHRASES, META_OPENINGS
    from specsteer.settings import Params
    from specsteer_lab.eval.data import EvalError

    default = EvalConfig.of("email")
    old = EvalConfig.of("email", end_release=1.0, meta_openings=(), assistant_openings=(),
                        assistant_phrases=())
    meta_only = EvalConfig.of("email", assistant_openings=())
    theirs = ["Here's the thing: I hope you're doing fine."]  # the user's retrieved texts
    for name in ("slm_rag", "llm", "specsteer@0.5", "specsteer:fast"):
        spec = parse_method(name)
        assert default.params(spec).end_release == Params().end_release
        assert default.params(spec).meta_openings == META_OPENINGS + ASSISTANT_OPENINGS
        fitted = default.params(spec, None, theirs).meta_openings
        assert fitted == META_OPENINGS + tuple(
            p for p in ASSISTANT_OPENINGS if p not in ("Here's the", "I hope you're doing"))
        assert meta_only.params(spec).meta_openings == META_OPENINGS
        assert (old.params(spec).end_release, old.params(spec).meta_openings) == (1.0, ())
        assert default.params(spec).banned_phrases == ASSISTANT_PHRASES
        assert "**" not in default.params(spec, None, ["a **bold** claim"]).banned_phrases
        assert old.params(spec).banned_phrases == ()
    with pytest.raises(EvalError, match="end_release"):  # before any model loads
        EvalConfig.of("email", end_release=0.0)


def test_the_release_floor_is_a_share_of_each_users_minimum():
    from specsteer.history.length import LengthPolicy
    from specsteer_lab.eval.data import EvalError

    length = LengthPolicy(samples=3, median_tokens=70, median_words=50, min_new_tokens=41,
                          max_new_tokens=120)
    for name in ("slm_rag", "llm", "specsteer@0.5"):
        spec = parse_method(name)
        assert EvalConfig.of("email").params(spec, length).release_after == 21  # ceil(20.5)
        anywhere = EvalConfig.of("email", end_release_from=0.0)
        assert anywhere.params(spec, length).release_after == 0
        assert EvalConfig.of("email", user_length=False).params(spec, length
                                                                  ).release_after == 0
    with pytest.raises(EvalError, match="end_release_from"):
        EvalConfig.of("email", end_release_from=1.5)


def test_the_budget_is_the_tasks_unless_given(tiny_model, tiny_generalist):
    """No --max-prompt-tokens: each task's measured budget, recorded in the run's config (so a
    folder resumes only under the budget it was run with); a budget given wins."""
    from specsteer.history.prompts import get_task, task_names
    from specsteer_lab.eval.harness import run_config

    for task in task_names():
        assert EvalConfig.of(task).max_prompt_tokens == get_task(task).max_prompt_tokens
        assert EvalConfig.of(task, max_prompt_tokens=200).max_prompt_tokens == 200
    small = Harness(tiny_model, tiny_generalist,
                    EvalConfig.of("review", retrieve_k=2, max_prompt_tokens=200))
    assert run_config(small, None)["max_prompt_tokens"] == 200


def test_public_prompt_never_holds_the_context(harness, reviews):
    prepared = harness.prepare(reviews[0])
    tokenizer = harness.specialist.tokenizer
    private = tokenizer.decode(prepared.device.private_ids, skip_special=False)
    public = tokenizer.decode(prepared.device.public_ids, skip_special=False)
    assert prepared.records  # BM25 found the kettle reviews
    assert "smells of plastic" in private
    assert "smells of plastic" not in public
    assert "Stainless steel electric kettle" in public
    assert len(prepared.records) <= harness.config.retrieve_k


def test_every_method_runs_and_counts_the_wire(harness, reviews, tmp_path):
    specs = parse_methods(DEFAULT_METHODS)
    rows = {row["method"]: row for row in
            run_eval(harness, reviews[:1], specs, tmp_path / "results.jsonl")}
    assert list(rows) == [s.label for s in specs]
    for label, row in rows.items():
        assert 1 <= row["tokens"] <= 6, label
        assert row["tokens_per_s"] > 0
        scores = rouge(row["text"], row["gold"])
        assert (row["rouge1"], row["rougeL"]) == (scores.rouge1, scores.rougeL)
        if row["base_method"] in ("slm", "slm_rag"):
            assert row["bytes_up"] == row["bytes_down"] == row["round_trips"] == 0, label
            assert row["companion_s"] == 0.0
            assert row["acceptance"] is None
        else:
            assert row["bytes_up"] > 0 and row["bytes_down"] > 0, label
            # one session open plus at least one request per round
            assert row["round_trips"] >= row["rounds"] + 1 >= 2, label
            assert 0 < row["companion_s"] < row["wall_s"], label
            assert row["bytes_up_per_token"] == pytest.approx(row["bytes_up"] / row["tokens"])
    for label in ("speculative", "specsteer@1.0", "specsteer@0.5", "specsteer@0.1"):
        assert rows[label]["drafted"] > 0 and 0 <= rows[label]["acceptance"] <= 1
    for label in ("llm", "light_costeer", "costeer"):  # one companion row per token
        assert rows[label]["round_trips"] == rows[label]["tokens"] + 1
        assert rows[label]["acceptance"] is None
    assert rows["specsteer@0.5"]["gamma"] == 0.5 and rows["llm"]["gamma"] is None


def test_same_model_accepts_every_draft(tiny_model, reviews, tmp_path):
    # Specialist == Generalist and no private context: P_G == P_S0 == P_Sc, so the greedy
    # drafts are the Generalist's argmax (speculative) and pass the ratio test at gamma < 1.
    same = Harness(tiny_model, tiny_model, EvalConfig.of("review", max_new_tokens=9,
                                                       retrieve_k=0))
    rows = {r["method"]: r for r in run_eval(same, reviews[:1],
                                             parse_methods(["speculative", "specsteer@0.5",
                                                            "llm", "slm"]),
                                             tmp_path / "results.jsonl")}
    assert rows["speculative"]["acceptance"] == 1.0
    assert rows["specsteer@0.5"]["acceptance"] == 1.0
    assert rows["speculative"]["text"] == rows["llm"]["text"] == rows["slm"]["text"]
    # every round drafts K=4 and adds a bonus token: 9 tokens in 2 rounds
    assert rows["specsteer@0.5"]["rounds"] == 2


def test_resume_skips_rows_already_written(harness, reviews, tmp_path):
    results = tmp_path / "out" / "results.jsonl"
    first = list(run_eval(harness, reviews, parse_methods(["slm", "specsteer@0.5"]), results))
    assert len(first) == 4
    with results.open("a") as sink:
        sink.write('{"user": "A2KETT')  # a write cut short by an interrupted run
    seen: list[tuple[str, str, bool]] = []
    second = list(run_eval(harness, reviews, parse_methods(["slm", "specsteer@0.5", "llm"]),
                           results, progress=lambda e, s, r: seen.append((e.user, s.label,
                                                                          r is None))))
    assert [(r["user"], r["method"]) for r in second] == [("A2KETTLE", "llm"), ("B7BOOKS", "llm")]
    assert seen.count(("A2KETTLE", "slm", True)) == 1
    keys = [(r["user"], r["method"]) for r in read_results(results)]
    assert len(keys) == len(set(keys)) == 6
    assert list(run_eval(harness, reviews, parse_methods(["llm"]), results)) == []


def test_emulated_rtt_is_paid_per_companion_reply(tiny_model, tiny_generalist, reviews,
                                                  tmp_path):
    rtt = Harness(tiny_model, tiny_generalist, EvalConfig.of("review", max_new_tokens=4,
                                                          retrieve_k=1, rtt_ms=25))
    started = time.perf_counter()
    (row,) = run_eval(rtt, reviews[:1], parse_methods(["llm"]), tmp_path / "r.jsonl")
    assert row["round_trips"] == 5  # open + 4 rows
    assert row["companion_s"] >= 5 * 0.025
    assert row["wall_s"] >= row["companion_s"]
    assert time.perf_counter() - started >= 5 * 0.025
    assert row["rtt_ms"] == 25


# ---------------------------------------------------------------------------------- report

def _row(method: str, base: str, user: str, tokens: int, seconds: float, rouge_l: float,
         **extra: object) -> dict:
    row = {"user": user, "method": method, "base_method": base, "gamma": None, "tokens": tokens,
           "effective_s": seconds, "ttft_s": 0.5, "rouge1": rouge_l, "rougeL": rouge_l,
           "drafted": 0, "accepted": 0, "round_trips": 0, "bytes_up": 0, "bytes_down": 0}
    row.update(extra)
    return row


def test_report_aggregates_and_speedup_over_llm(tmp_path):
    rows = [
        _row("llm", "llm", "u1", 10, 5.0, 0.2, round_trips=11, bytes_up=200, bytes_down=2000),
        _row("llm", "llm", "u2", 10, 5.0, 0.4, round_trips=11, bytes_up=200, bytes_down=2000),
        _row("slm_rag", "slm_rag", "u1", 20, 2.0, 0.3),
        _row("specsteer@0.5", "specsteer", "u1", 20, 4.0, 0.5, gamma=0.5, drafted=16,
             accepted=12, round_trips=6, bytes_up=300, bytes_down=900),
    ]
    summaries = {s.label: s for s in summarize(rows)}
    assert summaries["llm"].tokens_per_s == pytest.approx(2.0)
    assert summaries["llm"].rougeL == pytest.approx(0.3)
    assert summaries["llm"].speedup == pytest.approx(1.0)
    assert summaries["specsteer@0.5"].speedup == pytest.approx(2.5)  # 5 tok/s over 2 tok/s
    assert summaries["specsteer@0.5"].acceptance == pytest.approx(0.75)
    assert summaries["specsteer@0.5"].bytes_down_per_token == pytest.approx(45.0)
    assert summaries["slm_rag"].acceptance is None
    assert [s.label for s in summarize(rows)] == ["slm_rag", "llm", "specsteer@0.5"]
    text = render_report(rows, {"task": "email", "specialist": "s", "generalist": "g"},
                         "plot.png")
    assert "| SpecSteer (γ=0.5) | 1 | 50.00 | 50.00 | 75.0 % | 5.00 | 2.50×" in text
    assert "| LLM | 2 | 30.00 | 30.00 | – | 2.00 | 1.00×" in text
    png = plot_quality_vs_speed(rows, tmp_path / "q.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pipelining_changes_no_output(tiny_model, tiny_generalist, reviews, tmp_path):
    # The harness pipelines as a device does; with it off or on, greedy text must not change.
    specs = parse_methods(["speculative", "specsteer@0.5"])
    texts = []
    for pipeline in (False, True):
        config = EvalConfig.of("review", max_new_tokens=10, retrieve_k=2, pipeline=pipeline)
        rows = run_eval(Harness(tiny_model, tiny_generalist, config), reviews[:1], specs,
                        tmp_path / f"{pipeline}.jsonl")
        texts.append([(r["text"], r["acceptance"]) for r in rows])
    assert texts[0] == texts[1]


# ------------------------------------------------------------- length policy and user measures

def test_every_method_gets_the_users_length_bounds(tiny_model, tiny_generalist, reviews,
                                                   tmp_path):
    config = EvalConfig.of("review", max_new_tokens=40, retrieve_k=2)
    harness = Harness(tiny_model, tiny_generalist, config)
    prepared = harness.prepare(reviews[0])
    assert prepared.length is not None
    low, high = prepared.length.clamp(40)
    # the user's own retrieved texts, which exempt the assistant openings they write
    bodies = "\n".join(record.body for record in reviews[0].records)
    assert prepared.user_texts and all(text[:40] in bodies for text in prepared.user_texts)
    assert 0 < low <= high <= 40
    rows = list(run_eval(harness, reviews[:2], parse_methods(["slm_rag", "llm",
                                                               "specsteer@0.5"]),
                         tmp_path / "r.jsonl"))
    first = [row for row in rows if row["user"] == reviews[0].user]
    assert {(row["min_new_tokens"], row["max_new_tokens"]) for row in first} == {(low, high)}
    assert all(low <= row["tokens"] <= high for row in first)
    # the measures a user would feel are in every row, against the other user of the run
    for row in rows:
        words = len(row["text"].split())
        assert row["length_ratio"] == pytest.approx(words / row["user_median_words"])
        assert row["style_margin"] == pytest.approx(row["style_own"] - row["style_others"])
    off = EvalConfig.of("review", max_new_tokens=40, retrieve_k=2, user_length=False)
    assert off.params(parse_method("llm"), prepared.length).min_new_tokens == 0
    assert off.params(parse_method("llm"), prepared.length).max_new_tokens == 40


def test_voices_use_the_users_own_words(tmp_path):
    from specsteer.history import make_record
    from specsteer_lab.eval.data import Example
    from specsteer_lab.eval.voice import Voices

    def user(name: str, body: str) -> Example:
        records = tuple(make_record(kind="email", id=f"{name}{i}", title="s",
                                    body=f"bob wrote:\n> quoted words here\n{body}")
                        for i in range(3))
        return Example(user=name, task="email", query={"subject": "s"}, gold="g",
                       records=records)

    voices = Voices([user("ana", "Cheers mate, ta very much"),
                     user("bo", "DEAR SIR. I AM WRITING. REGARDS.")])
    assert voices.by_user["ana"].median_words == 5  # quotes and attribution not counted
    ana = voices.measure("ana", "Cheers mate, ta")
    assert ana["length_ratio"] == pytest.approx(3 / 5)
    assert ana["style_margin"] > 0 > voices.measure("bo", "Cheers mate, ta")["style_margin"]
    alone = Voices([user("ana", "hi there")]).measure("ana", "hi")
    assert alone["style_margin"] is None and alone["length_ratio"] == pytest.approx(0.5)


def test_report_shows_user_measures_and_paired_intervals():
    import random

    from specsteer_lab.eval.compare import specsteer_differences
    from specsteer_lab.eval.report import report_json

    rng = random.Random(3)
    rows = []
    for index in range(20):
        user = f"u{index}"
        base = rng.uniform(0.1, 0.3)
        rows.append(_row("llm", "llm", user, 10, 5.0, base, length_ratio=0.4 + index % 2 * 0.3,
                         style_own=0.5, style_margin=0.01))
        # SpecSteer is better on every user by 5 to 15 points on both metrics
        rows.append(_row("specsteer@0.5", "specsteer", user, 10, 4.0,
                         base + rng.uniform(0.05, 0.15), gamma=0.5, length_ratio=1.0,
                         style_own=0.6, style_margin=0.05))
        # SLM+RAG ties SpecSteer on ROUGE-1 only half the time: noise around it
        rows.append(_row("slm_rag", "slm_rag", user, 10, 2.0,
                         rows[-1]["rouge1"] + rng.uniform(-0.1, 0.1)))
    found = {(d.baseline, d.metric): d.interval for d in specsteer_differences(rows)}
    assert set(found) == {("llm", "rouge1"), ("llm", "rougeL"), ("slm_rag", "rouge1"),
                          ("slm_rag", "rougeL")}
    llm = found[("llm", "rouge1")]
    assert llm.n == 20 and 5 < llm.low < llm.mean < llm.high < 15 and llm.excludes_zero
    assert found[("slm_rag", "rouge1")].low < 0 < found[("slm_rag", "rouge1")].high
    text = render_report(rows, {"task": "abstract"})
    assert "| LLM | 20 | " in text and "| 0.55 | 0.500 | 0.010 |" in text  # 0.4 / 0.7
    assert f"| SpecSteer (γ=0.5) − LLM | 20 | {llm.mean:+.2f} [{llm.low:+.2f}, " in text
    assert "SpecSteer (γ=0.5) − SLM+RAG" in text
    summary = report_json(rows, {"task": "abstract"})
    assert summary["users"] == 20
    llm_row = next(m for m in summary["methods"] if m["label"] == "llm")
    assert llm_row["length_ratio"] == pytest.approx(0.55)
    assert {(d["baseline"], d["metric"]) for d in summary["differences"]} == set(found)
    assert next(d for d in summary["differences"] if d["baseline"] == "llm")["low"] == \
        pytest.approx(llm.low)


def test_differences_pair_only_users_both_methods_ran_on():
    from specsteer_lab.eval.compare import paired_difference

    rows = [_row("llm", "llm", "a", 1, 1.0, 0.1), _row("llm", "llm", "b", 1, 1.0, 0.9),
            _row("specsteer@0.5", "specsteer", "a", 1, 1.0, 0.3, gamma=0.5)]
    only_a = paired_difference(rows, "specsteer@0.5", "llm", "rougeL")
    assert only_a is not None and only_a.interval.n == 1
    assert only_a.interval.mean == pytest.approx(20.0)
    assert paired_difference(rows, "specsteer@0.5", "slm", "rougeL") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_eval_leaves_no_companion_behind(tmp_path):
    """`companion_process` starts the companion to die with its parent: an evaluation killed
    outright (SIGKILL: no `finally` runs) must not leave a process holding both models."""
    import os
    import signal
    import subprocess

    from specsteer.models.tiny import tiny_model_dir

    script = (
        "import sys, time\n"
        "from specsteer_lab.eval.harness import companion_process\n"
        f"with companion_process({str(tiny_model_dir('llama', seed=1))!r}, "
        f"{str(tiny_model_dir('llama', seed=0))!r}, 'int8', 1, 0.0):\n"
        "    import glob\n"
        "    kids = [open(f).read().split() for f in glob.glob('/proc/self/task/*/children')]\n"
        "    print(*[pid for pids in kids for pid in pids], flush=True)\n"
        "    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    companions = [int(pid) for pid in parent.stdout.readline().split()]
    assert companions, "the companion did not start"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 15
    alive = companions
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _running(pid)]
        time.sleep(0.2)
    assert not alive, f"companion {alive} outlived the killed evaluation"


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
