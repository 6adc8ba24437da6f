"""A Unix socket that forwards every connection to the gateway's TCP address: the one way out of a sandbox.

A sandbox has no network. A harness that runs inside it (Claude Code executes its tools in-process) reaches
the model through one Unix socket bound into it (`/run/harnessrl/gateway.sock`); the CLI talks HTTP over it
(`ANTHROPIC_UNIX_SOCKET`). The forwarder listens on that socket on the host, in a temp dir of its own, and
pipes bytes to `host:port` — the gateway of this run, local or remote (a Ray worker on another node reaches
the driver's gateway the same way), so the gateway needs no socket of its own. One daemon thread runs an
asyncio loop for all connections; `close()` stops it and removes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from pathlib import Path
from urllib.parse import urlsplit

from harnessrl.sandbox import leftovers

CHUNK = 1 << 16


class UnixForwarder:
    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the gateway URL must be http://host:port/..., got {target_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.dir = leftovers.make_tempdir("gwsock")
        self.path = self.dir / "gateway.sock"
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-forwarder", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(30)
        except BaseException:
            self.close()
            raise

    async def _listen(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()  # the client sees a closed connection: the gateway is unreachable
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    def close(self) -> None:
        loop = self._loop
        if loop.is_closed():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def socket(self) -> Path:
        return self.path


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copies until EOF (then half-closes `dst`) or an error on either side (then closes `dst`)."""
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except OSError:
        with contextlib.suppress(Exception):
            dst.close()
