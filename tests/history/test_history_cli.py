"""`specsteer history ...` through typer's CliRunner, and every command documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specsteer.cli import app
from specsteer.cli.history import app as history_app
from specsteer.history import HistoryStore

runner = CliRunner()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def run(*args: str, input: str | None = None, ok: bool = True):
    result = runner.invoke(app, ["history", *args], input=input)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def test_add_list_search_delete_roundtrip(tmp_path: Path) -> None:
    db = str(tmp_path / "h.db")
    record_id = run("add", "--db", db, "--title", "Trip", "--body", "Pack the tent").stdout.strip()
    options = ["--kind", "email", "--title", "Re: tent", "--created-at", "2024-01-02"]
    options += ["--meta", '{"to": "sam"}', "--json"]
    added = json.loads(run("add", "--db", db, *options, input="Sam, the tent is packed.\n").stdout)
    assert added["body"] == "Sam, the tent is packed." and added["meta"] == {"to": "sam"}
    listed = json.loads(run("list", "--db", db, "--json").stdout)
    assert [r["id"] for r in listed] == [added["id"], record_id]
    assert json.loads(run("list", "--db", db, "--kind", "note", "--json").stdout)[0]["id"] == (
        record_id
    )
    hits = json.loads(run("search", "--db", db, "tent AND (packed", "--json").stdout)
    assert {h["id"] for h in hits} == {record_id, added["id"]} and hits[0]["score"] > 0
    text = run("search", "--db", db, "tent", "--kind", "email").stdout
    assert added["id"] in text and record_id not in text
    assert "deleted 1" in run("delete", "--db", db, record_id).stdout
    assert [r["id"] for r in json.loads(run("list", "--db", db, "--json").stdout)] == [added["id"]]


def test_import_files_and_shared_user(tmp_path: Path, data_dir: Path) -> None:
    db = str(tmp_path / "h.db")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# Alpha\n\nfirst note")
    (notes / "b.txt").write_text("second note")
    first = json.loads(run("import", "--db", db, str(notes), "--json").stdout)
    assert first[str(notes)] == {"added": 2, "updated": 0, "unchanged": 0}
    again = run("import", "--db", db, str(notes)).stdout
    assert "0 added, 0 updated, 2 unchanged" in again
    shared = data_dir / "lamp7_dev_top100_users.json"
    report = json.loads(run("import", "--db", db, str(shared), "--user", "4", "--json").stdout)
    assert report[str(shared)]["added"] > 30
    refused = run("import", "--db", db, str(shared), ok=False)
    assert refused.exit_code == 1 and "--user" in refused.stderr


def test_forget_and_stats(tmp_path: Path) -> None:
    db = str(tmp_path / "h.db")
    with HistoryStore(db) as store:
        store.add(kind="email", title="old", body="x", created_at="2019")
        store.add(kind="email", title="new", body="y", created_at="2023")
        store.add(kind="note", body="z")
    stats = json.loads(run("stats", "--db", db, "--json").stdout)
    assert stats["records"] == 3 and stats["kinds"] == {"email": 2, "note": 1}
    assert "email: 2" in run("stats", "--db", db).stdout
    declined = run("forget", "--db", db, "--kind", "note", input="n\n", ok=False)
    assert declined.exit_code == 1
    assert json.loads(run("stats", "--db", db, "--json").stdout)["records"] == 3
    out = run("forget", "--db", db, "--kind", "email", "--before", "2020", "--yes", "--json").stdout
    assert json.loads(out) == {"deleted": 1, "erase_pending": False}
    assert "deleted 2" in run("forget", "--db", db, "--all", input="y\n").stdout
    assert json.loads(run("stats", "--db", db, "--json").stdout)["records"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["forget"], "--kind and/or --before, or --all"),
        (["forget", "--all", "--kind", "note", "--yes"], "not both"),
        (["delete", "no-such-id"], "no records with ids"),
        (["add", "--body", "x", "--kind", "Bad Kind"], "kind 'Bad Kind'"),
        (["add", "--body", "x", "--meta", "{oops"], "--meta is not valid JSON"),
        (["search", "x", "--before", "someday"], "not an ISO-8601 date"),
    ],
)
def test_errors_are_one_line_and_exit_1(tmp_path: Path, args: list[str], message: str) -> None:
    result = run(args[0], "--db", str(tmp_path / "h.db"), *args[1:], ok=False)
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.output


def test_corrupt_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"definitely not sqlite" * 100)
    result = run("stats", "--db", str(bad), ok=False)
    assert result.exit_code == 1 and "not a readable history database" in result.stderr


def test_db_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTEER_HISTORY_DB", str(tmp_path / "env.db"))
    run("add", "--body", "from the environment")
    assert (tmp_path / "env.db").exists()


def test_every_command_is_documented() -> None:
    commands = typer.main.get_command(history_app).commands  # type: ignore[attr-defined]
    assert set(commands) == {"add", "import", "search", "list", "delete", "forget", "stats"}
    docs = DOCS.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### `specsteer history (\w+)", docs, flags=re.MULTILINE))
    assert set(commands) <= headings, f"undocumented: {sorted(set(commands) - headings)}"
    for name, command in commands.items():
        for param in command.params:
            for option in param.opts:
                if option.startswith("--") and option != "--help":
                    assert option in docs, f"`{name} {option}` is not in docs/history.md"
