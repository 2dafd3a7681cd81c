"""The CI rule for tests that back a claim: a missing model, data set or tool skips on a
developer machine and fails with CI=true, where everything is installed (./dev setup)."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true: this test cannot skip ({reason})")
    pytest.skip(reason)
