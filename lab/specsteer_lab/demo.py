"""The main job: a real personalized email through the SDK and a companion on real models.

`specsteer-lab demo` starts `specsteer-companion serve` as a separate process (Qwen 1.5B
Generalist + the same Qwen 0.5B artifact as generic Specialist), imports a writer's earlier texts
into a history store on the device side, and writes that writer's email for a new subject with
SpecSteer, streaming each token coloured by provenance. The writer is, by default, the persona
that ships in the repository (`sample_apps/data`: Wren, a community-garden coordinator; notes and
sent mail), so a plain clone runs it; `--data FILE` picks a sender of the shared newsgroups set
instead (evaluation data, outside the repository). This module owns the models and the writer's
store; the command (`specsteer_lab.cli.demo`) owns the companion process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specsteer.errors import SpecSteerError
from specsteer.models.registry import home

# The persona's data, in the repository next to the sample apps (lab/specsteer_lab/demo.py -> root).
PERSONA_DIR = Path(__file__).resolve().parents[2] / "sample_apps" / "data"
PERSONA_FILES = ("notes.json", "sent.mbox")
# What the demo asks the persona to write: an email to the garden's mailing list.
PERSONA_QUERY = {"subject": "Bulb planting day", "to": "the growers list"}


def device_precision(specialist: str, asked: str | None) -> str:
    """The precision the demo's device runs `specialist` at: `asked`, else a device's default."""
    from specsteer.models.registry import get_spec

    return asked or get_spec(specialist).device_default


def prepare_models(models: list[tuple[str, str]], say: Callable[[str], None]) -> None:
    """Fetch and compile each (name, precision) the demo needs (cached after the first run)."""
    from specsteer.models.compile import compile_model
    from specsteer.models.fetch import fetch

    for name, precision in models:
        fetch(name, progress=say)
        compile_model(name, precision, progress=say)


def user_store(data: Path, user: int):
    """A history store with one sender's earlier posts (the query post excluded)."""
    from specsteer.history import HistoryStore, load_shared_user

    shared = load_shared_user(data, user)
    store = HistoryStore(home() / "demo" / f"newsgroups-user{user}.db")
    store.add_many(shared.records)
    return store, shared


def persona_store(folder: Path = PERSONA_DIR):
    """A history store with the persona's notes and sent mail (imports are idempotent)."""
    from specsteer.history import HistoryStore
    from specsteer.history.ingest import ingest_path

    missing = [name for name in PERSONA_FILES if not (folder / name).is_file()]
    if missing:
        raise SpecSteerError(
            f"the persona data is missing from {folder} ({', '.join(missing)}); run the demo "
            "from a clone of the repository, or pass --data FILE (a newsgroups data set)"
        )
    store = HistoryStore(home() / "demo" / "persona.db")
    for name in PERSONA_FILES:
        ingest_path(store, folder / name)
    return store
