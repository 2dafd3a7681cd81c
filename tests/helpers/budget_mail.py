"""The budget mails the tests write about: four earlier emails of one task and the two requests
(the second extends the first), shared by test_prepare and test_prepare_session; and a short
history of two mails (the batching and first-token tests)."""

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


def two_mails() -> HistoryStore:
    """An in-memory history of a budget email and a meeting-notes reply (one per thread: an
    in-memory SQLite store belongs to the thread that made it)."""
    store = HistoryStore(memory=True)
    store.add(kind="email", title="Budget for the next quarter",
              body="Dear team, the budget for the next quarter stays as it is.")
    store.add(kind="email", title="Meeting notes",
              body="Thank you for the meeting notes, I will send the revised draft by Friday.")
    return store
