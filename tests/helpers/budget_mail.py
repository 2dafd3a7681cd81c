"""The budget mails the prepare tests write about: four earlier emails of one task and the two
requests (the second extends the first), shared by test_prepare and test_prepare_session."""

from __future__ import annotations

from specsteer.history import HistoryStore

REQUEST = "Budget for the next quarter"
CHANGED = "Budget for the next quarter and the offsite"


def budget_history() -> HistoryStore:
    """An in-memory history of four budget emails (enough to fill a private prompt)."""
    history = HistoryStore(memory=True)
    for n in range(4):
        history.add(kind="email", title=f"Budget for quarter {n}",
                    body=f"Dear team, the budget for quarter {n} stays as it is. " * 6)
    return history
