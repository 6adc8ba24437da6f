"""Admin routes (all need `Authorization: Bearer <admin_token>`):

POST /admin/sessions {rollout_id, group_id, train_chains?} -> {session_id, api_key, base_url, openai_base_url, anthropic_base_url}
GET  /admin/sessions/{sid}                            -> session status, chain/call counts
POST /admin/sessions/{sid}/end {status?, reason?}     -> ends it (status ok|failed)
POST /admin/pause {mode: finish|abort, timeout_s?, hold_new?}
                                                      -> new calls get 429 + Retry-After (hold_new: they wait
                                                         until resume); waits for in-flight
POST /admin/resume                                    -> aborted calls resume with their partial tokens
GET  /admin/metrics                                   -> counters (drift, rollbacks, splits, fsync batches, …);
                                                         `engine`: the engine's own stats when it has them
POST /admin/export {out_dir, session_id?, rollout_id?, selection?} -> Parquet files written by the gateway
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

from aiohttp import web

from harnessrl.engine.base import Engine

from .auth import require_admin
from .bodies import read_small_json
from .config import GatewayConfig
from .enums import EndStatus, PauseMode, Selection, TrainChains
from .errors import HTTPError
from .export import export_journal
from .journal import Journal
from .messages import RequestError
from .metrics import GatewayMetrics
from .params import choice, flag, integer, number, optional_str
from .pause import PauseControl
from .sessions import SessionStore


class AdminAPI:
    def __init__(
        self,
        admin_token: str,
        config: GatewayConfig,
        sessions: SessionStore,
        pause: PauseControl,
        journal: Journal,
        metrics: GatewayMetrics,
        base_url: Callable[[], str],
    ) -> None:
        self.admin_token, self.config = admin_token, config
        self.sessions, self.pause, self.journal, self.metrics = sessions, pause, journal, metrics
        self.base_url = base_url

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/admin/sessions", self.create_session)
        router.add_get("/admin/sessions/{sid}", self.get_session)
        router.add_post("/admin/sessions/{sid}/end", self.end_session)
        router.add_post("/admin/pause", self.pause_calls)
        router.add_post("/admin/resume", self.resume_calls)
        router.add_get("/admin/metrics", self.get_metrics)
        router.add_post("/admin/export", self.export)

    async def _body(self, request: web.Request) -> dict:
        require_admin(request, self.admin_token)
        return await read_small_json(request, self.config)

    async def create_session(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        for k in ("rollout_id", "group_id"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise RequestError(f"{k}: required non-empty string")
        train_chains = choice(TrainChains, body.get("train_chains") or TrainChains.ALL, "train_chains")
        reply_tokens, context_tokens = (
            None if body.get(k) is None else integer(body[k], k, 1)
            for k in ("reply_tokens", "context_tokens")
        )
        s, key = await self.sessions.create(
            body["rollout_id"], body["group_id"], train_chains, reply_tokens, context_tokens
        )
        base = f"{self.base_url()}/sessions/{s.session_id}"
        return web.json_response(
            {
                "session_id": s.session_id,
                "api_key": key,
                "base_url": self.base_url(),
                "openai_base_url": f"{base}/v1",
                "anthropic_base_url": base,
            }
        )

    async def get_session(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        return web.json_response(self.sessions.get(request.match_info["sid"]).view())

    async def end_session(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        s = self.sessions.get(request.match_info["sid"])
        status = choice(EndStatus, body.get("status") or EndStatus.OK, "status")
        await self.sessions.end(s, status.session_status(), optional_str(body.get("reason"), "reason"))
        return web.json_response(s.view())

    async def pause_calls(self, request: web.Request) -> web.Response:
        body = await self._body(request)  # everything is checked before the gateway pauses
        mode = choice(PauseMode, body.get("mode") or PauseMode.FINISH, "mode")
        timeout = body.get("timeout_s")
        timeout_s = 600.0 if timeout is None else number(timeout, "timeout_s")
        hold_new = flag(body.get("hold_new", False), "hold_new")
        return web.json_response(await self.pause.pause(mode, timeout_s, hold_new))

    async def resume_calls(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        self.pause.resume()
        return web.json_response({"paused": False})

    async def get_metrics(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        m = self.metrics.as_dict()
        m.update(
            sessions=len(self.sessions.sessions),
            in_flight=len(self.pause.in_flight),
            paused=self.pause.paused,
            journal_fsyncs=self.journal.fsyncs,
            journal_records=self.journal.records_written,
            journal_write_failures=self.journal.write_failures,
            journal_broken=self.journal.broken is not None,
        )
        engine_stats = await _engine_stats(self.pause.engine)
        if engine_stats is not None:
            m["engine"] = engine_stats
        return web.json_response(m)

    async def export(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        out_dir = body.get("out_dir")
        if not isinstance(out_dir, str) or not out_dir:
            raise RequestError("out_dir: required path (on the gateway's file system)")
        selection = choice(Selection, body.get("selection") or Selection.ALL, "selection")
        session_id = optional_str(body.get("session_id"), "session_id")
        rollout_id = optional_str(body.get("rollout_id"), "rollout_id")
        try:
            result = await asyncio.to_thread(
                export_journal, self.journal.path, out_dir, selection, session_id, rollout_id
            )
        except OSError as e:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            raise HTTPError(
                507 if full else 400,
                "export_failed",
                f"out_dir: cannot write the export to {out_dir!r}: {e.strerror or e}",
            ) from None
        return web.json_response(result)


async def _engine_stats(engine: Engine) -> dict | None:
    """The engine's figures, or None when it reports none or does not answer within 5 s."""
    try:
        reported = await asyncio.wait_for(engine.stats(), 5.0)
    except TimeoutError:
        return None
    return dict(reported.figures) if reported is not None else None
