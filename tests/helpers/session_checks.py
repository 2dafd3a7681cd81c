"""Checks shared by the tests of both runtimes (imported by name, like tests/e2e/dying_channel)."""

from __future__ import annotations

import pytest

from specsteer.errors import SessionError
from specsteer.runtime.base import LanguageModel, Session


def check_session_errors(model: LanguageModel) -> Session:
    """The seam's session errors, the same for every runtime; returns the session (3 tokens)."""
    session = model.new_session(max_length=8)
    with pytest.raises(SessionError, match="token ids must lie"):
        session.append([model.vocab_size])
    with pytest.raises(SessionError, match="at least one"):
        session.append([])
    session.append([1, 2, 3])
    with pytest.raises(SessionError, match="cannot rewind"):
        session.rewind(4)
    with pytest.raises(SessionError, match="max_length"):
        session.append(list(range(10, 16)))
    return session
