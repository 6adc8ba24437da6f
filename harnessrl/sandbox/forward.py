"""A Unix socket that forwards every connection to the gateway's TCP address: the one way out of a sandbox.

A sandbox has no network. A harness that runs inside it (Claude Code executes its tools in-process) reaches
the model through one Unix socket bound into it (`/run/harnessrl/gateway.sock`); the CLI talks HTTP over it
(`ANTHROPIC_UNIX_SOCKET`). The forwarder listens on that socket on the host, in a temp dir of its own, and
pipes bytes to `host:port` — the gateway of this run, local or remote (a Ray worker on another node reaches
the driver's gateway the same way), so the gateway needs no socket of its own. One daemon thread runs an
asyncio loop for all connections; `close()` stops it and removes the socket.

In a Kubernetes sandbox pod it runs as the pod's second container, on a socket in a volume both containers
mount (sandbox/kubernetes.py):

    python -m harnessrl.sandbox.forward --socket /run/harnessrl/gateway.sock --to http://gateway:8080
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from harnessrl.sandbox import leftovers
from harnessrl.sandbox.identity import let_group_connect

CHUNK = 1 << 16


class UnixForwarder:
    """`path`: where to listen (default: a temp dir of its own, removed at close)."""

    def __init__(self, target_url: str, path: Path | None = None) -> None:
        parts = urlsplit(target_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the gateway URL must be http://host:port/..., got {target_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.dir: Path | None = None  # a temp dir of ours, removed at close
        if path is None:
            self.dir = leftovers.make_tempdir("gwsock")
            path = self.dir / "gateway.sock"
        self.path = Path(path)
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
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)

    @property
    def socket(self) -> Path:
        return self.path


def forwarder_for(url: str, closers: list[Callable[[], None]], gid: int | None) -> Path:
    """A forwarder to the gateway at `url` for one sandbox: closed with the sandbox (`closers`), its socket
    connectable by the sandbox's group `gid` (None: ours). Returns the socket on the host."""
    forwarder = UnixForwarder(url)
    closers.append(forwarder.close)
    if gid is not None:
        let_group_connect(forwarder.socket, gid)
    return forwarder.socket


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.sandbox.forward", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to listen on")
    parser.add_argument("--to", required=True, help="the gateway's URL (http://host:port[/...])")
    args = parser.parse_args(argv)
    args.socket.unlink(missing_ok=True)  # a socket left by an earlier run of this container
    forwarder = UnixForwarder(args.to, args.socket)
    args.socket.chmod(0o660)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"forwarding {args.socket} -> {forwarder.host}:{forwarder.port}", flush=True)
    stop.wait()
    forwarder.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
