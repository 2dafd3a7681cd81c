"""An emulated network between a device and a companion on one machine (benchmarks, eval).

`DelayProxy` sits on a loopback port in front of a companion and holds every chunk, each way,
for half the round trip: the device sees a companion across a network, with the real sockets,
frames and websocket handshakes in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class DelayProxy:
    """Loopback TCP proxy delaying each chunk by `one_way_s` in both directions (in order)."""

    def __init__(self, upstream_port: int, one_way_s: float) -> None:
        self.upstream_port, self.one_way_s = upstream_port, one_way_s
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.server: asyncio.Server | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # `close` cancels this task: it ends quietly, or Python 3.11's start_server callback
        # logs the cancellation as an error with a traceback (it calls `task.exception()`)
        with contextlib.suppress(asyncio.CancelledError):
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.one_way_s, data))
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError):
            await sender

    def close(self) -> None:
        """Stop listening, drop the connections still open, and end the proxy's thread."""
        async def shutdown() -> None:
            if self.server is not None:
                self.server.close()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        if self.loop.is_closed():
            return
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
