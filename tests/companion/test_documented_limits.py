"""The limits table in docs/companion-security.md is what runs: each documented default equals
`ServerConfig`'s and the `specsteer-companion serve` option's (issue 19 found a documented rate
of 20/s, burst 40, while 200/s, burst 400 ran)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import typer

from specsteer_companion.cli import app
from specsteer_companion.server import ServerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "companion-security.md"
# the limits the table documents; each is a `serve` flag unless None
FLAGS = {
    "hello_timeout_s": "--hello-timeout",
    "max_connections_per_address": "--max-connections-per-address",
    "max_connections": "--max-connections",
    "max_unauthenticated": "--max-unauthenticated",
    "requests_per_second": "--rate",
    "burst": "--burst",
    "prefill_tokens_per_second": "--prefill-rate",
    "prefill_burst": "--prefill-burst",
    "max_sessions_per_identity": None,  # no option: a deployment choice in code
    "max_sessions": "--max-sessions",
}


def documented() -> dict[str, float]:
    """{ServerConfig field: the number in the table's default column}."""
    rows = re.findall(r"^\| [^|]*\(`(\w+)`\) \| ([\d,.]+)", DOC.read_text(), re.MULTILINE)
    return {field: float(value.replace(",", "")) for field, value in rows}


def test_every_documented_limit_is_the_default_that_runs() -> None:
    table = documented()
    assert set(table) == set(FLAGS), "the limits table and this test list different limits"
    config = ServerConfig()
    serve = {p.opts[0]: p.default for p in typer.main.get_command(app).commands["serve"].params}
    for field, value in table.items():
        assert getattr(config, field) == value, field
        if FLAGS[field] is not None:
            assert serve[FLAGS[field]] == value, f"serve {FLAGS[field]}"
            assert f"`{FLAGS[field]}`" in DOC.read_text(), f"{FLAGS[field]} is not documented"


def test_serve_sets_each_limit_it_offers() -> None:
    """A limit flag reaches the `ServerConfig` the server runs with, under its own field."""
    command = typer.main.get_command(app).commands["serve"]
    flagged = {f.name: f.metadata["flag"][0] for f in dataclasses.fields(ServerConfig)
               if "flag" in f.metadata}
    assert flagged.keys() >= {k for k, v in FLAGS.items() if v}
    names = {p.opts[0]: p.name for p in command.params}
    for field_name, decl in flagged.items():
        assert names[decl] == field_name, decl
