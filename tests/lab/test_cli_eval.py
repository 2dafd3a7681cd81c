"""`specsteer-lab eval` end to end on tiny models: files written, resume, errors as one red line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specsteer.models.tiny import tiny_model_dir

pytestmark = pytest.mark.slow  # whole evaluation runs: not in ./dev test --fast

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from specsteer_lab.cli import app

    return app


def _args(out: Path, *methods: str) -> list[str]:
    return ["eval", "--task", "review", "--data", str(DATA / "lamp_reviews.jsonl"),
            "--users", "2", "--methods", *methods,
            "--specialist", str(tiny_model_dir("llama", seed=0)),
            "--generalist", str(tiny_model_dir("llama", seed=1)),
            "--max-new-tokens", "5", "--retrieve-k", "2", "--out", str(out)]


def test_eval_writes_results_report_and_plot_then_resumes(app, tmp_path):
    runner = CliRunner()
    out = tmp_path / "run"
    result = runner.invoke(app, _args(out, "slm", "llm", "specsteer@0.5"))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["user"], r["method"]) for r in rows) == sorted(
        (user, method) for user in ("A2KETTLE", "B7BOOKS")
        for method in ("slm", "llm", "specsteer@0.5"))
    report = (out / "report.md").read_text()
    assert "| SpecSteer (γ=0.5) | 2 |" in report and "| LLM | 2 |" in report
    assert "quality_vs_speed.png" in report
    assert (out / "quality_vs_speed.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert [m["label"] for m in summary["methods"]] == ["slm", "llm", "specsteer@0.5"]
    assert {(d["baseline"], d["metric"]) for d in summary["differences"]} == {
        (base, metric) for base in ("slm", "llm") for metric in ("rouge1", "rougeL")}
    assert "SpecSteer (γ=0.5) − LLM | 2 |" in report and "median length ratio" in report
    assert json.loads((out / "run.json").read_text())["max_new_tokens"] == 5
    assert "| SLM | 2 |" in result.stdout
    assert "[6/6] B7BOOKS · specsteer@0.5" in result.output and "ETA" in result.output

    again = runner.invoke(app, _args(out, "slm", "llm", "specsteer@0.5", "costeer"))
    assert again.exit_code == 0, again.output
    rows = (out / "results.jsonl").read_text().splitlines()
    assert len(rows) == 8  # only the two costeer rows were added
    assert "[8/8] B7BOOKS · costeer" in again.output and "[7/8]" in again.output
    assert "| CoSteer | 2 |" in (out / "report.md").read_text()


def test_the_companion_process_gives_the_threads_text_over_a_delayed_websocket(app, tmp_path):
    """--companion process (the default) serves the same models from a child process over a
    websocket through the emulated network: the same text and frames as the in-process
    companion, every round trip paid, and run.json says where the companion ran."""
    runner = CliRunner()
    rows = {}
    for where in ("process", "thread"):
        out = tmp_path / where
        result = runner.invoke(app, [*_args(out, "llm", "specsteer@0.5"), "--companion", where,
                                     "--rtt-ms", "60"])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "run.json").read_text())["companion"] == where
        rows[where] = {(r["user"], r["method"]): r for r in
                       map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert rows["process"].keys() == rows["thread"].keys()
    for key, row in rows["process"].items():
        same = rows["thread"][key]
        assert (row["text"], row["bytes_up"], row["bytes_down"], row["round_trips"]) == (
            same["text"], same["bytes_up"], same["bytes_down"], same["round_trips"])
        assert row["round_trips"] > 1
        # each request and reply crossed the proxy: the round trips follow one another
        assert row["wall_s"] >= row["round_trips"] * 0.06


@pytest.mark.parametrize("where", ["process", "thread"])
def test_eval_runs_the_specialist_as_a_device_does(app, tmp_path, monkeypatch, where):
    """The Specialist is loaded by `load_device_model` (the device's runtime and, for a
    registry name, its default precision unless --specialist-precision says otherwise): the
    speed and the text are what a Client's user gets. --precision is the Generalist's, loaded
    here only for a companion in this process (a companion process loads its own)."""
    import specsteer.runtime as runtime

    calls: list[tuple[str, str, object]] = []

    def spy(name: str, loader):
        def load(folder, precision=None, threads=None):
            calls.append((name, str(folder), precision))
            return loader(folder, precision=precision, threads=threads)
        return load

    monkeypatch.setattr(runtime, "load_device_model", spy("device", runtime.load_device_model))
    monkeypatch.setattr(runtime, "load_model", spy("genai", runtime.load_model))
    args = [*_args(tmp_path / "run", "slm", "specsteer@0.5"), "--specialist-precision", "w8a8",
            "--precision", "int8", "--companion", where]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    specialist = str(tiny_model_dir("llama", seed=0))
    generalist = str(tiny_model_dir("llama", seed=1))
    loaded_here = [("genai", generalist, "int8")] if where == "thread" else []
    assert calls == [("device", specialist, "w8a8"), *loaded_here]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["generalist"] and run["generalist_sha256"]  # its identity all the same


def test_eval_refuses_to_mix_setups_in_one_folder(app, tmp_path):
    runner = CliRunner()
    out = tmp_path / "run"
    assert runner.invoke(app, _args(out, "slm")).exit_code == 0
    changed = _args(out, "slm")
    changed[changed.index("--max-new-tokens") + 1] = "7"
    result = runner.invoke(app, changed)
    assert result.exit_code == 1
    assert "max_new_tokens" in result.output and "another --out" in result.output
    norepeat = [*_args(out, "slm"), "--no-repeat-ngram", "6"]
    result = runner.invoke(app, norepeat)
    assert result.exit_code == 1 and "no_repeat_ngram" in result.output


def test_eval_budget_is_the_tasks_and_the_budget_table_reads_the_runs(app, tmp_path, capsys,
                                                                       monkeypatch):
    """No --max-prompt-tokens: the task's budget, kept in run.json; bench/prompt_budget.py
    then compares runs of one task at two budgets on the same users."""
    import runpy
    import sys

    from specsteer.history.prompts import get_task

    runner = CliRunner()
    default, small = tmp_path / "default", tmp_path / "small"
    assert runner.invoke(app, _args(default, "specsteer@0.5")).exit_code == 0
    budget = get_task("review").max_prompt_tokens
    assert json.loads((default / "run.json").read_text())["max_prompt_tokens"] == budget
    result = runner.invoke(app, [*_args(small, "specsteer@0.5"), "--max-prompt-tokens", "400"])
    assert result.exit_code == 0, result.output
    assert json.loads((small / "run.json").read_text())["max_prompt_tokens"] == 400
    tokens = [json.loads(line)["private_prompt_tokens"]
              for line in (small / "results.jsonl").read_text().splitlines()]
    assert max(tokens) < min(json.loads(line)["private_prompt_tokens"] for line
                             in (default / "results.jsonl").read_text().splitlines())

    script = Path(__file__).parents[2] / "bench" / "prompt_budget.py"
    monkeypatch.setattr(sys, "argv", ["prompt_budget.py", str(default), str(small)])
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"task review; differences against budget {budget} on the same users"
    rows = [line.split(" | ") for line in lines if line.startswith("| specsteer@0.5")]
    assert [row[1] for row in rows] == ["400", str(budget)]  # smallest budget first
    assert [row[2] for row in rows] == ["2", "2"]  # users
    assert float(rows[0][3]) == sum(tokens) / len(tokens)
    assert rows[0][-1].startswith(("+", "-")) and rows[1][-3:] == ["–", "–", "– |"]


def test_compare_runs_labels_runs_by_the_setting_that_differs(app, tmp_path, capsys,
                                                             monkeypatch):
    """bench/compare_runs.py: two runs that differ in alpha, paired on the same users."""
    import runpy
    import sys

    runner = CliRunner()
    one, two = tmp_path / "a1", tmp_path / "a2"
    assert runner.invoke(app, [*_args(one, "slm_rag", "specsteer@0.5"), "--alpha", "1"]
                         ).exit_code == 0
    assert runner.invoke(app, [*_args(two, "specsteer@0.5"), "--alpha", "2"]).exit_code == 0
    script = Path(__file__).parents[2] / "bench" / "compare_runs.py"
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(one), str(two)])
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "task review; each run against `alpha=1.0` on the same users"
    rows = [line.split(" | ") for line in lines if line.startswith("| ")][1:]
    assert [row[0:3] for row in rows] == [["| specsteer@0.5", "alpha=1.0", "2"],
                                          ["| specsteer@0.5", "alpha=2.0", "2"]]  # no slm_rag
    assert rows[0][-2:] == ["–", "– |"] and rows[1][-2].startswith(("+", "-"))
    assert rows[1][9].isdigit() and rows[0][8].endswith("/2")
    # a setting chosen on the first users, checked on the later ones
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(one), str(two), "--users-from", "2"])
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("on the same users (users 2 on)")
    assert [line.split(" | ")[2] for line in lines if line.startswith("| specsteer")] == ["1", "1"]


def test_compare_runs_counts_a_verbatim_loop():
    import runpy

    loops = runpy.run_path(str(Path(__file__).parents[2] / "bench" / "compare_runs.py"))["loops"]
    sentence = "the model writes this very same sentence again. "
    assert loops(sentence * 3) and not loops(sentence * 2)
    assert not loops("a text that says one thing and then says another thing entirely")


def test_history_ceiling_pairs_the_llm_with_the_generalist_reading_the_history(
        app, tmp_path, capsys, monkeypatch):
    """bench/history_ceiling.py: the reference is SLM+RAG with the run's Generalist."""
    import runpy
    import sys

    runner = CliRunner()
    run, reference, wrong = tmp_path / "run", tmp_path / "ref", tmp_path / "wrong"
    assert runner.invoke(app, _args(run, "llm", "specsteer@0.5")).exit_code == 0
    args = _args(reference, "slm_rag")
    args[args.index("--specialist") + 1] = args[args.index("--generalist") + 1]
    assert runner.invoke(app, args).exit_code == 0
    script = str(Path(__file__).parents[2] / "bench" / "history_ceiling.py")
    monkeypatch.setattr(sys, "argv", ["history_ceiling.py", str(run), str(reference)])
    runpy.run_path(script, run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "2 users"
    rows = {row.split(" | ")[0][2:]: row.split(" | ") for row in lines if row.startswith("| ")}
    assert set(rows) == {"method", "llm", "specsteer@0.5", "Generalist reading the history"}
    assert rows["llm"][3:] == ["–", "–", "–", "– |"]
    reference_row = rows["Generalist reading the history"]
    assert reference_row[3].startswith(("+", "-")) and reference_row[5:] == ["–", "– |"]
    assert all(cell.startswith(("+", "-")) for cell in rows["specsteer@0.5"][3:])
    # the reference's own numbers are the SLM+RAG run's, relabelled
    ref_rows = [json.loads(line) for line in (reference / "results.jsonl").read_text().splitlines()]
    mean = 100 * sum(row["rouge1"] for row in ref_rows) / len(ref_rows)
    assert reference_row[1] == f"{mean:.2f}"
    # a reference whose Specialist is not the run's Generalist is refused in one line
    assert runner.invoke(app, _args(wrong, "slm_rag")).exit_code == 0
    monkeypatch.setattr(sys, "argv", ["history_ceiling.py", str(run), str(wrong)])
    with pytest.raises(SystemExit, match="is not the run's Generalist"):
        runpy.run_path(script, run_name="__main__")
    # ...and so is one made with other decoding settings
    args = _args(tmp_path / "longer", "slm_rag")
    args[args.index("--specialist") + 1] = args[args.index("--generalist") + 1]
    args[args.index("--max-new-tokens") + 1] = "6"
    assert runner.invoke(app, args).exit_code == 0
    monkeypatch.setattr(sys, "argv", ["history_ceiling.py", str(run), str(tmp_path / "longer")])
    with pytest.raises(SystemExit, match="differ in max_new_tokens"):
        runpy.run_path(script, run_name="__main__")


def test_history_ceiling_accepts_a_setting_added_after_the_run():
    """A key only one run.json has is a setting added later, at its old behaviour (the sixth
    pass's folders have no loop_ngram); a key both have must agree."""
    import runpy

    check = runpy.run_path(str(Path(__file__).parents[2] / "bench" / "history_ceiling.py")
                           )["check_pairing"]
    run = {"task": "email", "alpha": 1.0, "generalist_sha256": "g", "specialist_sha256": "s"}
    check(run, {**run, "specialist_sha256": "g", "loop_ngram": 0})
    with pytest.raises(SystemExit, match="differ in alpha"):
        check(run, {**run, "specialist_sha256": "g", "alpha": 2.0})


def test_eval_runs_a_preset_and_the_no_repeat_rule(app, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*_args(out, "specsteer:fast", "specsteer@0.1"),
                                      "--no-repeat-ngram", "3"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["no_repeat_ngram"] == 3
    report = (out / "report.md").read_text()
    assert "| SpecSteer fast (γ=0.1) | 2 |" in report and "| SpecSteer (γ=0.1) | 2 |" in report


@pytest.mark.parametrize(("methods", "message"), [
    (["gpt4"], "unknown method"),
    (["costeer@0.5"], "only specsteer takes a gamma"),
    (["llm:fast"], "a preset goes with specsteer"),
])
def test_bad_methods_are_one_line_errors(app, tmp_path, methods, message):
    result = CliRunner().invoke(app, _args(tmp_path / "out", *methods))
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_task_and_missing_data_are_errors(app, tmp_path):
    args = _args(tmp_path / "out", "slm")
    args[args.index("--task") + 1] = "poetry"
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "poetry" in result.output
    args = _args(tmp_path / "out", "slm")
    args[args.index("--data") + 1] = str(tmp_path / "missing.jsonl")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "does not exist" in result.output


def test_lab_cli_has_eval_and_demo_with_their_options():
    from specsteer_lab.cli import app as lab_app

    runner = CliRunner()
    result = runner.invoke(lab_app, ["eval", "--help"])
    assert result.exit_code == 0
    for option in ("--task", "--data", "--users", "--methods", "--specialist", "--generalist",
                   "--precision", "--max-new-tokens", "--retrieve-k", "--rtt-ms", "--out"):
        assert option in result.output
    result = runner.invoke(lab_app, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--user", "--data", "--specialist", "--generalist", "--precision", "--preset",
                   "--max-new-tokens", "--max-prompt-tokens", "--warm-start"):
        assert option in result.output
    # the demo writes in the sender's voice from the first token: no Generalist opening
    # (docs/BENCHMARKS.md, issue 14 second pass); the settings it decodes with are its own
    # defaults under the flags given
    from specsteer.cli.options import settings_from
    from specsteer_lab.cli.demo import DEMO_DECODING

    assert DEMO_DECODING.warm_start is False
    assert settings_from({}, DEMO_DECODING) == DEMO_DECODING
    assert settings_from({"warm_start": True, "preset": "fast"}, DEMO_DECODING) == \
        DEMO_DECODING.updated(warm_start=True, gamma=0.1, top_k=32)


def test_device_cli_has_neither_eval_nor_demo():
    from specsteer.cli import app as device_app

    runner = CliRunner()
    for command in ("eval", "demo"):
        result = runner.invoke(device_app, [command, "--help"])
        assert result.exit_code == 2 and "No such command" in result.output
    assert runner.invoke(device_app, ["generate", "--help"]).exit_code == 0
