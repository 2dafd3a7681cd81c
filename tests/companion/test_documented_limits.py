"""The limits table in docs/companion-security.md is what runs: each documented default equals
`ServerConfig`'s and the `specsteer-companion serve` option's (issue 19 found a documented rate
of 20/s, burst 40, while 200/s, burst 400 ran)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from specsteer_companion.cli import app
from specsteer_companion.server import ServerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "companion-security.md"
# ServerConfig field -> the serve option that sets it
OPTIONS = {
    "hello_timeout_s": "hello_timeout",
    "max_connections_per_address": "max_connections_per_address",
    "max_connections": "max_connections",
    "max_unauthenticated": "max_unauthenticated",
    "requests_per_second": "rate",
    "burst": "burst",
    "prefill_tokens_per_second": "prefill_rate",
    "prefill_burst": "prefill_burst",
    "max_sessions_per_identity": None,  # no option: a deployment choice in code
    "max_sessions": "max_sessions",
}


def documented() -> dict[str, float]:
    """{ServerConfig field: the number in the table's default column}."""
    rows = re.findall(r"^\| [^|]*\(`(\w+)`\) \| ([\d,.]+)", DOC.read_text(), re.MULTILINE)
    return {field: float(value.replace(",", "")) for field, value in rows}


def test_every_documented_limit_is_the_default_that_runs() -> None:
    table = documented()
    assert set(table) == set(OPTIONS), "the limits table and this test list different limits"
    config = ServerConfig()
    serve = {p.name: p.default for p in typer.main.get_command(app).commands["serve"].params}
    for field, value in table.items():
        assert getattr(config, field) == value, field
        if OPTIONS[field] is not None:
            assert serve[OPTIONS[field]] == value, f"serve --{OPTIONS[field].replace('_', '-')}"
