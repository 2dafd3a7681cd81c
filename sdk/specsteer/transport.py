"""Thin network adapter for the device: a websocket frame channel.

All protocol logic lives in `protocol`/`link`; this module only moves frames and turns every
network failure (refused, timed out, dropped) into `CompanionUnavailable`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from specsteer.errors import (
    CompanionTimedOut,
    CompanionTLSError,
    CompanionUnavailable,
    ProtocolError,
)
from specsteer.protocol import ErrorCode

# A verdict is a few hundred bytes; allow the largest row reply and a long prompt with margin.
MAX_FRAME_BYTES = 2**16 + 1024


class _DeviceConnection(ClientConnection):
    """A websockets connection whose receive thread reads nothing before the upgrade request is
    sent, and whose socket is shut down before it is closed.

    websockets' receive thread starts before the handshake and reads the socket as soon as it is
    readable, while the calling thread writes the upgrade request. A TLS 1.3 server sends its
    session tickets right after the handshake, so the thread's `SSL_read` can be processing a
    ticket at the very moment the request goes through `SSL_write` on the same OpenSSL object,
    which is not safe from two threads: the write returned and the request never reached the
    wire (the kernel counted only the ClientHello and Finished sent), the server waited for it,
    and the connect timed out. About 1 connect in 170 against a local uvicorn, as Serve's proxy
    runs it, and 2 of 8 sequential generations against the Ray application (docs/scale.md,
    "A handshake left unanswered"). Holding the first read until the request is out removes the
    overlap: the tickets come before the server's answer, so they are read while this thread
    waits for that answer and writes nothing.

    The receive thread can also sit in a blocking `SSLSocket.recv`: a session ticket (or half a
    record) makes the socket readable, and OpenSSL then waits for application data. Closing the
    file descriptor from another thread does not wake that read on Linux, and websockets joins
    the thread after every close (a handshake timeout, a close that timed out), so against a
    peer that completes TLS and then says nothing, `connect(open_timeout=10)` returned only
    when the peer hung up: minutes. `shutdown` wakes the read at once (EOF).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._request_sent = threading.Event()  # before super(): it starts the receive thread
        super().__init__(*args, **kwargs)

    def send_data(self) -> None:
        super().send_data()
        self._request_sent.set()  # the first send is the upgrade request

    def recv_events(self) -> None:
        self._request_sent.wait()
        super().recv_events()

    def close_socket(self) -> None:
        with contextlib.suppress(OSError):  # not connected, or already shut down
            # the plain socket's shutdown: SSLSocket.shutdown would drop the SSL object that the
            # receive thread may be reading with
            socket.socket.shutdown(self.socket, socket.SHUT_RDWR)
        super().close_socket()
        self._request_sent.set()  # a receive thread still waiting finds the socket closed


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
                create_connection=_DeviceConnection,
            )
            self._ws: ClientConnection = self._connect.__enter__()
        except ssl.SSLCertVerificationError as exc:  # no retry makes it verify
            raise CompanionTLSError(
                f"the companion at {url} presented a certificate that does not verify "
                f"({exc.verify_message}): pass Client(ssl_context=...) trusting its issuer, or "
                "fix the URL's host name") from exc
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
