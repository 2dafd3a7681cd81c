"""A test channel to an in-process companion that dies after a number of frames."""

from __future__ import annotations

from specsteer.errors import CompanionUnavailable
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel


class DyingChannel(LocalChannel):
    """Works for `frames` frames, then the companion is gone."""

    def __init__(self, endpoint: CompanionEndpoint, frames: int) -> None:
        super().__init__(endpoint)
        self.left = frames

    def send(self, frame: bytes) -> None:
        self.left -= 1
        if self.left < 0:
            raise CompanionUnavailable("connection reset")
        super().send(frame)
