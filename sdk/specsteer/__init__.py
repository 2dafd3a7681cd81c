"""SpecSteer SDK: personalized generation on the device, steered by a cloud Generalist.

The private history never leaves the device: only drafted token ids go up, and the device adds
its private term to the companion's sparse verdict locally.

    from specsteer import Client, HistoryStore
    client = Client("qwen2.5-0.5b", history=HistoryStore("me.db"), companion="wss://...")
    print(client.generate("Budget for next quarter", task="email").text)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from specsteer.client import Client
    from specsteer.generation import GenerationStats, Piece, Result, Stream
    from specsteer.history import HistoryStore, Record
    from specsteer.settings import Params

_LAZY = {
    "Client": "specsteer.client",
    "GenerationStats": "specsteer.generation",
    "Piece": "specsteer.generation",
    "Result": "specsteer.generation",
    "Stream": "specsteer.generation",
    "Params": "specsteer.settings",
    "HistoryStore": "specsteer.history",
    "Record": "specsteer.history",
}
__all__ = [
    "Client",
    "GenerationStats",
    "HistoryStore",
    "Params",
    "Piece",
    "Record",
    "Result",
    "Stream",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import the public classes on first use, so `import specsteer` stays cheap."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specsteer' has no attribute {name!r}")
