"""The gateway HTTP service: wires the parts together and runs them (in a thread, or on the caller's loop).

Parts: `harness_api` (per-session OpenAI / Anthropic routes), `admin` (admin routes), `sessions`, `calls` (one
model call: plan, generate, record, journal, commit), `pause` (pause / drain / abort / resume), `recovery`
(journal replay on start), `metrics`, `export`; `bodies` (size limit, decoding, off-loop work for large
requests). Every error reply is JSON (`errors`). `GET /health` needs no auth; it answers 503 once the journal
can record nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web, web_app

from harnessrl.engine.base import Engine

from .admin import AdminAPI
from .bodies import Offload
from .calls import CallRunner
from .config import GatewayConfig
from .errors import error_middleware
from .harness_api import HarnessAPI
from .journal import Journal
from .metrics import GatewayMetrics
from .pause import PauseControl
from .recovery import recover_journal
from .render import ChatRenderer
from .sessions import Session, SessionStore

# stopping waits this long for calls in flight, then cancels them (aiohttp waits 60 s by default, longer than
# `stop()` waits; a call still generating when its owner stops the gateway has no one left to answer to, and a
# record being written is shielded from the cancellation)
STOP_GRACE_S = 5.0

__all__ = ["GatewayConfig", "GatewayServer"]


@dataclass
class _Parts:
    """What exists while the gateway runs (the journal directory is locked from start to stop)."""

    journal: Journal
    sessions: SessionStore
    pause: PauseControl
    offload: Offload
    calls: CallRunner


class GatewayServer:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        journal_dir: str | Path,
        admin_token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        config: GatewayConfig | None = None,
    ) -> None:
        if not admin_token:
            raise ValueError("admin_token must be a non-empty string")
        self.engine = engine
        self.config = config or GatewayConfig()
        self.renderer = ChatRenderer(tokenizer, self.config.tool_format)
        self.journal_dir = Path(journal_dir)
        self.admin_token = admin_token
        self.host, self.port = host, port
        self.metrics = GatewayMetrics()
        self.base_url = ""
        self._parts: _Parts | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def parts(self) -> _Parts:
        if self._parts is None:
            raise RuntimeError("the gateway is not started (call start() or start_async())")
        return self._parts

    @property
    def sessions(self) -> dict[str, Session]:
        return self.parts.sessions.sessions

    # -- lifecycle --------------------------------------------------------------------------------------
    def _open(self) -> _Parts:
        journal = Journal(self.journal_dir)
        try:
            sessions = SessionStore(journal, self.renderer, self.config)
            calls, report = recover_journal(sessions, journal, self.config.salvage)
        except BaseException:
            journal.close()
            raise
        self.metrics.recovered_calls += calls
        self.metrics.salvaged_dropped_lines += len(report.dropped)
        pause = PauseControl(self.engine, self.metrics)
        offload = Offload(self.config)
        runner = CallRunner(
            self.engine, self.renderer, self.config, journal, sessions, self.metrics, pause, offload
        )
        return _Parts(journal, sessions, pause, offload, runner)

    async def start_async(self) -> str:
        self._parts = self._open()
        self._runner = web.AppRunner(
            self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=STOP_GRACE_S
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    async def stop_async(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        with contextlib.suppress(Exception):  # an HTTP client's connections on this loop; the engine stays up
            await self.engine.release()
        if self._parts:
            self._parts.journal.close()
        # aiohttp caches each route's handler wrapped in the middlewares, process-wide (1,024 entries): the
        # handlers are this gateway's bound methods, so the cache held the stopped gateway and its engine —
        # a model and its caches (0.8 GB for the tiny model) per gateway a process had run
        web_app._cached_build_middleware.cache_clear()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop serving (after `start`): engine calls of the gateway's owner run there too."""
        return self._loop

    def start(self) -> str:
        """Serves from a background thread with its own event loop; returns the base URL."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as e:  # reported to the caller of start()
                error.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="gateway", daemon=True)
        self._thread.start()
        ready.wait(120)
        if error:
            raise error[0]
        return self.base_url

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread:
            self._thread.join(30)

    def app(self) -> web.Application:
        p = self.parts
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[error_middleware(self.config.retry_after_s)],
        )
        app.router.add_get("/health", self._health)
        AdminAPI(
            self.admin_token, self.config, p.sessions, p.pause, p.journal, self.metrics, lambda: self.base_url
        ).add_routes(app.router)
        HarnessAPI(p.sessions, p.calls, self.renderer, self.config, self.metrics, p.offload).add_routes(
            app.router
        )
        return app

    async def _health(self, request: web.Request) -> web.Response:
        p = self.parts
        if p.journal.broken is not None:
            return web.json_response(
                {"ok": False, "paused": p.pause.paused, "journal_error": str(p.journal.broken)}, status=503
            )
        return web.json_response({"ok": True, "paused": p.pause.paused})
