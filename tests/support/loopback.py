"""Real aiohttp servers on loopback for tests, served from a thread of their own (the test stays synchronous),
and a kubeconfig pointing at one (for servers that speak the Kubernetes API)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import yaml
from aiohttp import web


class ThreadedServer:
    """Serves an `web.Application` on 127.0.0.1 (a free port) from a daemon thread."""

    def __init__(self, name: str, shutdown_timeout: float = 1.0) -> None:
        self.name, self.shutdown_timeout = name, shutdown_timeout
        self.loop = asyncio.new_event_loop()
        self.base_url = ""
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def start(self, app: web.Application) -> str:
        ready = threading.Event()

        async def boot() -> None:
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
            ready.set()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(boot())
            self.loop.run_forever()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        assert ready.wait(30), f"the loopback {self.name} did not start"
        return self.base_url

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def loopback_kubeconfig(base_url: str, path: Path) -> Path:
    """A kubeconfig pointing at `base_url` (what `config.load_kube_config` reads)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "loop", "cluster": {"server": base_url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "loop", "context": {"cluster": "loop", "user": "u"}}],
        "current-context": "loop",
    }
    path.write_text(yaml.safe_dump(config))
    return path
