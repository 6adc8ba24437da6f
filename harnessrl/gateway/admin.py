"""Admin routes (all need `Authorization: Bearer <admin_token>`):

POST /admin/sessions {rollout_id, group_id}           -> {session_id, api_key, base_url, openai_base_url, anthropic_base_url}
GET  /admin/sessions/{sid}                            -> session status, chain/call counts
POST /admin/sessions/{sid}/end {status?, reason?}     -> ends it (status ok|failed)
POST /admin/pause {mode: finish|abort, timeout_s?}    -> new calls get 429 + Retry-After; waits for in-flight
POST /admin/resume                                    -> aborted calls resume with their partial tokens
GET  /admin/metrics                                   -> counters (drift, rollbacks, splits, fsync batches, …)
POST /admin/export {out_dir, session_id?, rollout_id?, selection?} -> Parquet files written by the gateway
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

from aiohttp import web

from .auth import require_admin
from .bodies import read_json, read_optional_json
from .enums import EndStatus, PauseMode, Selection
from .export import export
from .journal import Journal
from .messages import RequestError
from .metrics import GatewayMetrics
from .pause import PauseControl
from .sessions import SessionStore

E = TypeVar("E", bound=StrEnum)


def _choice(enum: type[E], value: object, field: str) -> E:
    try:
        return enum(value)
    except ValueError:
        raise RequestError(f"{field}: one of {[e.value for e in enum]}, got {value!r}") from None


class AdminAPI:
    def __init__(
        self,
        admin_token: str,
        sessions: SessionStore,
        pause: PauseControl,
        journal: Journal,
        metrics: GatewayMetrics,
        base_url: Callable[[], str],
    ) -> None:
        self.admin_token = admin_token
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

    async def create_session(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        body, _ = await read_json(request)
        for k in ("rollout_id", "group_id"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise RequestError(f"{k}: required non-empty string")
        s, key = await self.sessions.create(body["rollout_id"], body["group_id"])
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
        require_admin(request, self.admin_token)
        s = self.sessions.get(request.match_info["sid"])
        body = await read_optional_json(request)
        status = _choice(EndStatus, body.get("status", EndStatus.OK), "status")
        await self.sessions.end(s, status.session_status(), body.get("reason"))
        return web.json_response(s.view())

    async def pause_calls(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        body = await read_optional_json(request)
        mode = _choice(PauseMode, body.get("mode", PauseMode.FINISH), "mode")
        return web.json_response(await self.pause.pause(mode, float(body.get("timeout_s", 600))))

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
        )
        return web.json_response(m)

    async def export(self, request: web.Request) -> web.Response:
        require_admin(request, self.admin_token)
        body, _ = await read_json(request)
        if not isinstance(body.get("out_dir"), str):
            raise RequestError("out_dir: required path (on the gateway's file system)")
        result = await asyncio.to_thread(
            export,
            list(self.journal.replay()),
            body["out_dir"],
            body.get("selection", Selection.ALL),
            body.get("session_id"),
            body.get("rollout_id"),
        )
        return web.json_response(result)
