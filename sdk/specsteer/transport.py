"""Thin network adapter for the device: a websocket frame channel.

All protocol logic lives in `protocol`/`link`; this module only moves frames and turns every
network failure (refused, timed out, dropped) into `CompanionUnavailable`.
"""

from __future__ import annotations

import contextlib
import ssl

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from specsteer.errors import CompanionTimedOut, CompanionUnavailable, ProtocolError
from specsteer.protocol import ErrorCode

# A verdict is a few hundred bytes; allow the largest row reply and a long prompt with margin.
MAX_FRAME_BYTES = 2**16 + 1024


class WebSocketChannel:
    """FrameChannel over a websocket (`ws://` or `wss://`)."""

    def __init__(
        self, url: str, *, ssl_context: ssl.SSLContext | None = None, open_timeout: float = 10.0
    ) -> None:
        self.url = url
        try:
            self._connect = connect(
                url,
                ssl=ssl_context,
                open_timeout=open_timeout,
                max_size=MAX_FRAME_BYTES,
                compression=None,
                close_timeout=2,
            )
            self._ws: ClientConnection = self._connect.__enter__()
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI, ConnectionClosed) as exc:
            # ConnectionClosed: the companion closed the socket during the handshake (full)
            raise CompanionUnavailable(f"cannot reach the companion at {url}: {exc}") from exc

    def send(self, frame: bytes) -> None:
        try:
            self._ws.send(frame)
        except (ConnectionClosed, OSError) as exc:
            raise CompanionUnavailable(
                f"the companion at {self.url} closed the connection"
            ) from exc

    def recv(self, timeout: float) -> bytes:
        try:
            data = self._ws.recv(timeout=timeout)
        except TimeoutError as exc:
            raise CompanionTimedOut(
                f"no answer from the companion at {self.url} within {timeout:.1f} s"
            ) from exc
        except (ConnectionClosed, OSError) as exc:
            raise CompanionUnavailable(
                f"the companion at {self.url} closed the connection"
            ) from exc
        if isinstance(data, str):
            raise ProtocolError(ErrorCode.BAD_FRAME, "the companion sent a text frame")
        return data

    def poll(self) -> bytes | None:
        """A frame if one has arrived, else None, without waiting."""
        try:
            return self.recv(0)
        except CompanionUnavailable as exc:
            if isinstance(exc.__cause__, TimeoutError):
                return None
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken socket must not raise
            self._connect.__exit__(None, None, None)
