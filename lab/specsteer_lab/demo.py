"""The main job: a real personalized email through the SDK and a companion on real models.

`specsteer-lab demo` starts `specsteer-companion serve` as a separate process (Qwen 1.5B
Generalist + the same Qwen 0.5B artifact as generic Specialist), imports one newsgroups sender's
earlier posts into a history store on the device side, and writes that sender's post for a new
subject with SpecSteer, streaming each token coloured by provenance. This module owns the models
and the sender's store; the command (`specsteer_lab.cli.demo`) owns the companion process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specsteer.models.registry import home


def prepare_models(names: list[str], precision: str, say: Callable[[str], None]) -> None:
    """Fetch and compile what the demo needs (cached after the first run)."""
    from specsteer.models.compile import compile_model
    from specsteer.models.fetch import fetch

    for name in names:
        fetch(name, progress=say)
        compile_model(name, precision, progress=say)


def user_store(data: Path, user: int):
    """A history store with one sender's earlier posts (the query post excluded)."""
    from specsteer.history import HistoryStore, load_shared_user

    shared = load_shared_user(data, user)
    store = HistoryStore(home() / "demo" / f"newsgroups-user{user}.db")
    store.add_many(shared.records)
    return store, shared
