"""A TCP forwarder on a loopback port that a test can cut and restore, to make a database
unreachable for the processes that connect through it without touching the shared server."""
from __future__ import annotations

import asyncio
import socket
import threading


class TcpProxy:
    """Forward 127.0.0.1:<port> to (host, target_port); `cut()` drops every connection and stops
    listening (clients get 'connection refused'), `restore()` listens again on the same port;
    `pause()` holds the traffic without dropping anything, `resume()` lets it through."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None

    def _call(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flow().wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _flow(self) -> asyncio.Event:
        if self._flowing is None:  # made on the proxy's loop
            self._flowing = asyncio.Event()
            self._flowing.set()
        return self._flowing

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flow().wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_writer)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _reset(self) -> int:
        n = len(self._writers) // 2
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        return n

    def reset(self) -> int:
        """Drop every live connection (each side gets a reset) but keep listening, as a flaky
        network or a restarting pooler does; returns how many connections were dropped."""
        return self._call(self._reset())

    def start(self) -> "TcpProxy":
        self._call(self._start())
        return self

    restore = start

    async def _set_flowing(self, on: bool) -> None:
        (self._flow().set if on else self._flow().clear)()

    def pause(self) -> None:
        """Hold every byte both ways, and new connections, keeping every connection open: a
        partition where the peers' statements hang (no error) until resume()."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """Deliver what pause() held, and forward again."""
        self._call(self._set_flowing(True))

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
