"""CHANGELOG.md names, for its newest entry, the protocol versions this code speaks, and the
package's own version has an entry; LICENSE is the licence the three packages declare."""

from __future__ import annotations

import re
from pathlib import Path

from specsteer import __version__, protocol
from specsteer.bridge.schemas import PROTOCOL_VERSION as BRIDGE_VERSION

REPO = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^## (?P<release>[^\n]+?) — wire protocol (?P<wire>\d+), bridge schema "
                   r"v(?P<bridge>\d+)$", re.M)


def test_the_newest_entry_names_the_protocols_spoken() -> None:
    entries = list(ENTRY.finditer((REPO / "CHANGELOG.md").read_text(encoding="utf-8")))
    assert entries, "no '## RELEASE — wire protocol N, bridge schema vM' heading"
    newest = entries[0]
    assert int(newest["wire"]) == protocol.PROTOCOL_VERSION
    assert int(newest["bridge"]) == BRIDGE_VERSION
    assert __version__ in [entry["release"] for entry in entries]


def test_the_licence_file_is_the_one_the_packages_declare() -> None:
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a notice
    for folder in (REPO, REPO / "cloud_companion", REPO / "lab"):
        project = (folder / "pyproject.toml").read_text(encoding="utf-8")
        assert re.search(r'^license = "Apache-2.0"$', project, re.M), folder
    node = (REPO / "bindings" / "node" / "package.json").read_text(encoding="utf-8")
    assert '"license": "Apache-2.0"' in node
