"""The gateway HTTP service: per-session OpenAI / Anthropic endpoints, admin endpoints, journal, recovery.

Routes (all JSON):
  POST /admin/sessions {rollout_id, group_id}           -> {session_id, api_key, base_url, openai_base_url, anthropic_base_url}
  GET  /admin/sessions/{sid}                            -> session status, chain/call counts
  POST /admin/sessions/{sid}/end {status?, reason?}     -> ends it (status ok|failed)
  POST /admin/pause {mode: finish|abort, timeout_s?}    -> new calls get 429 + Retry-After; waits for in-flight
  POST /admin/resume {policy_version?}                  -> aborted calls resume with their partial tokens
  GET  /admin/metrics                                   -> counters (drift, rollbacks, splits, fsync batches, …)
  POST /admin/export {out_dir, session_id?, rollout_id?, selection?} -> Parquet files written by the gateway
  POST /sessions/{sid}/v1/chat/completions              (Authorization: Bearer <api_key>)
  POST /sessions/{sid}/v1/messages                      (x-api-key: <api_key> or Bearer)
Admin routes need `Authorization: Bearer <admin_token>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from jinja2 import TemplateError

from harnessrl.engine.base import (
    Engine,
    EngineError,
    EngineRequestError,
    Generation,
    SamplingParams,
    generate_stream,
)

from . import api_formats as fmt
from .chains import CallPlan, ChainSet
from .journal import Journal
from .journal import loads as journal_loads
from .messages import (
    MessageHasher,
    Msg,
    PlainMessageCache,
    RequestError,
    anthropic_tools_to_openai,
    from_anthropic,
    from_openai,
    validate_openai_tools,
)
from .render import ChatRenderer, DiffError
from .samples import export as export_samples
from .streaming import SSEReply, stream_options


@dataclass
class GatewayConfig:
    max_model_len: int = 32768  # prompt + completion tokens the engine accepts
    min_new_tokens: int = (
        1  # below this much room the call ends with finish_reason "length" (never silently 1)
    )
    default_max_tokens: int = 1024
    drift_check_every: int = 10  # re-render the whole prompt every N-th call of a chain (0: never)
    rollback_any_depth: bool = (
        False  # rewinds deeper than the last assistant turn: False = split, True = truncate
    )
    tool_format: str = "hermes"
    retry_after_s: int = 2
    model_name: str = "harnessrl-policy"


@dataclass
class Session:
    session_id: str
    rollout_id: str
    group_id: str
    key_sha256: str
    chains: ChainSet
    message_cache: PlainMessageCache = field(default_factory=PlainMessageCache)
    status: str = "active"  # active | ended | failed
    reason: str | None = None
    calls: int = 0
    created_at: float = field(default_factory=time.time)


class _HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


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
        self.sessions: dict[str, Session] = {}
        self.metrics: dict[str, float] = {
            k: 0
            for k in (
                "calls",
                "calls_failed",
                "rejected_paused",
                "context_exhausted",
                "op_new",
                "op_extend",
                "op_rollback",
                "op_fork",
                "discarded_trainable_tokens",
                "drift_clean",
                "drift_realigned",
                "drift_forked",
                "aborted_generations",
                "recovered_calls",
                "gateway_cpu_s",
            )
        }
        self._journal: Journal | None = None
        self._paused = False
        self._resumed: asyncio.Event | None = None
        self._in_flight: set[asyncio.Task] = set()  # engine requests
        self._working: set[asyncio.Task] = set()  # calls generating or committing (not parked by a pause)
        self._aborting: set[asyncio.Task] = set()
        self._idle: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # -- lifecycle --------------------------------------------------------------------------------------
    def _new_session_state(self) -> ChainSet:
        return ChainSet(self.renderer, MessageHasher(), self.config.rollback_any_depth)

    def _recover(self) -> None:
        assert self._journal is not None
        for rec in self._journal.replay():
            t = rec.get("type")
            if t == "session":
                self.sessions[rec["session_id"]] = Session(
                    rec["session_id"],
                    rec["rollout_id"],
                    rec["group_id"],
                    rec["key_sha256"],
                    self._new_session_state(),
                    created_at=rec.get("created_at", 0.0),
                )
            elif t == "session_end" and rec["session_id"] in self.sessions:
                s = self.sessions[rec["session_id"]]
                if s.status != "failed":
                    s.status, s.reason = rec["status"], rec.get("reason")
            elif t == "call" and rec["session_id"] in self.sessions:
                s = self.sessions[rec["session_id"]]
                s.chains.commit(rec)
                s.calls += 1
                self.metrics["recovered_calls"] += 1

    async def start_async(self) -> str:
        self._journal = Journal(self.journal_dir)
        self._recover()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    async def stop_async(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        close = getattr(self.engine, "close", None)
        if inspect.iscoroutinefunction(
            close
        ):  # an HTTP client's connections on this loop; the engine stays up
            with contextlib.suppress(Exception):
                await close()
        if self._journal:
            self._journal.close()

    def start(self) -> str:
        """Serves from a background thread with its own event loop; returns the base URL."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.start_async())
            except BaseException as e:  # reported to the caller of start()
                error.append(e)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="gateway", daemon=True)
        self._thread.start()
        ready.wait(120)
        if error:
            raise error[0]
        return self.base_url

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(30)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._errors])
        r = app.router
        r.add_get("/health", self._health)
        r.add_post("/admin/sessions", self._create_session)
        r.add_get("/admin/sessions/{sid}", self._get_session)
        r.add_post("/admin/sessions/{sid}/end", self._end_session)
        r.add_post("/admin/pause", self._pause)
        r.add_post("/admin/resume", self._resume)
        r.add_get("/admin/metrics", self._metrics)
        r.add_post("/admin/export", self._export)
        r.add_post("/sessions/{sid}/v1/chat/completions", self._openai_chat)
        r.add_post("/sessions/{sid}/v1/messages", self._anthropic_messages)
        r.add_get("/sessions/{sid}/v1/models", self._models)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "paused": self._paused})

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except _HTTPError as e:
            return web.json_response(
                {"error": {"type": e.kind, "message": e.message}}, status=e.status, headers=e.headers
            )
        except RequestError as e:
            return web.json_response(
                {"error": {"type": "invalid_request_error", "message": str(e)}}, status=400
            )
        except (DiffError, TemplateError) as e:
            msg = f"the model's chat template cannot render these messages: {e}"
            return web.json_response({"error": {"type": "invalid_request_error", "message": msg}}, status=400)

    # -- auth / bodies ----------------------------------------------------------------------------------
    @staticmethod
    def _bearer(request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key", "")

    def _admin(self, request: web.Request) -> None:
        if not secrets.compare_digest(self._bearer(request), self.admin_token):
            raise _HTTPError(
                401, "authentication_error", "admin endpoints need 'Authorization: Bearer <admin token>'"
            )

    def _session_for(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        s = self.sessions.get(sid)
        if s is None or not secrets.compare_digest(_sha(self._bearer(request)), s.key_sha256):
            raise _HTTPError(401, "authentication_error", f"unknown session {sid!r} or wrong api key")
        return s

    @classmethod
    async def _json(cls, request: web.Request) -> dict:
        return (await cls._json_timed(request))[0]

    @staticmethod
    async def _json_timed(request: web.Request) -> tuple[dict, float]:
        """The JSON object body and the CPU seconds its decoding took."""
        raw = await request.read()
        cpu0 = time.thread_time()
        try:
            body = journal_loads(raw)
        except ValueError:
            raise RequestError("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body, time.thread_time() - cpu0

    # -- admin ------------------------------------------------------------------------------------------
    async def _create_session(self, request: web.Request) -> web.Response:
        self._admin(request)
        body = await self._json(request)
        for k in ("rollout_id", "group_id"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise RequestError(f"{k}: required non-empty string")
        sid = "s-" + uuid.uuid4().hex[:16]
        key = "hk-" + secrets.token_urlsafe(24)
        rec = {
            "type": "session",
            "session_id": sid,
            "rollout_id": body["rollout_id"],
            "group_id": body["group_id"],
            "key_sha256": _sha(key),
            "created_at": time.time(),
        }
        await self._journal.append(rec)
        self.sessions[sid] = Session(
            sid, body["rollout_id"], body["group_id"], rec["key_sha256"], self._new_session_state()
        )
        base = f"{self.base_url}/sessions/{sid}"
        return web.json_response(
            {
                "session_id": sid,
                "api_key": key,
                "base_url": self.base_url,
                "openai_base_url": f"{base}/v1",
                "anthropic_base_url": base,
            }
        )

    def _session_view(self, s: Session) -> dict:
        return {
            "session_id": s.session_id,
            "rollout_id": s.rollout_id,
            "group_id": s.group_id,
            "status": s.status,
            "reason": s.reason,
            "calls": s.calls,
            "chains": len(s.chains.chains),
        }

    async def _get_session(self, request: web.Request) -> web.Response:
        self._admin(request)
        s = self.sessions.get(request.match_info["sid"])
        if s is None:
            raise _HTTPError(404, "not_found", f"unknown session {request.match_info['sid']!r}")
        return web.json_response(self._session_view(s))

    async def _end_session(self, request: web.Request) -> web.Response:
        self._admin(request)
        s = self.sessions.get(request.match_info["sid"])
        if s is None:
            raise _HTTPError(404, "not_found", f"unknown session {request.match_info['sid']!r}")
        body = await self._json(request) if request.can_read_body else {}
        status = body.get("status", "ok")
        if status not in ("ok", "failed"):
            raise RequestError("status: 'ok' or 'failed'")
        await self._finish_session(s, "ended" if status == "ok" else "failed", body.get("reason"))
        return web.json_response(self._session_view(s))

    async def _finish_session(self, s: Session, status: str, reason: str | None) -> None:
        if s.status == "failed":
            return
        await self._journal.append(
            {
                "type": "session_end",
                "session_id": s.session_id,
                "status": "failed" if status == "failed" else "ended",
                "reason": reason,
                "at": time.time(),
            }
        )
        s.status, s.reason = status, reason

    async def _pause(self, request: web.Request) -> web.Response:
        self._admin(request)
        body = await self._json(request) if request.can_read_body else {}
        mode = body.get("mode", "finish")
        if mode not in ("finish", "abort"):
            raise RequestError(
                "mode: 'finish' (wait for in-flight calls) or 'abort' (abort and resume later)"
            )
        self._paused = True
        self._resumed.clear()
        if mode == "abort" and self._in_flight:
            if not await self._engine_abort():  # no engine-side abort: cancel; generated again after resume
                for task in list(self._in_flight):
                    self._aborting.add(task)
                    task.cancel()
                    self.metrics["aborted_generations"] += 1
        drained = True
        try:
            await asyncio.wait_for(self._idle.wait(), float(body.get("timeout_s", 600)))
        except TimeoutError:
            drained = False
        return web.json_response({"paused": True, "drained": drained, "in_flight": len(self._working)})

    async def _engine_abort(self) -> bool:
        """Engine-side abort (ours: the partial tokens come back with finish_reason "abort" and are kept)."""
        engine_abort = getattr(self.engine, "abort", None)
        if not callable(engine_abort):
            return False
        try:
            result = engine_abort()
            if asyncio.iscoroutine(result):
                await result
        except EngineError:
            return False  # e.g. vLLM has no /abort endpoint
        return True

    async def _resume(self, request: web.Request) -> web.Response:
        self._admin(request)
        self._paused = False
        self._resumed.set()
        return web.json_response({"paused": False})

    async def _metrics(self, request: web.Request) -> web.Response:
        self._admin(request)
        m = dict(self.metrics)
        m.update(
            sessions=len(self.sessions),
            in_flight=len(self._in_flight),
            paused=self._paused,
            journal_fsyncs=self._journal.fsyncs,
            journal_records=self._journal.records_written,
        )
        return web.json_response(m)

    async def _export(self, request: web.Request) -> web.Response:
        self._admin(request)
        body = await self._json(request)
        if not isinstance(body.get("out_dir"), str):
            raise RequestError("out_dir: required path (on the gateway's file system)")
        result = await asyncio.to_thread(
            export_samples,
            list(self._journal.replay()),
            body["out_dir"],
            body.get("selection", "all"),
            body.get("session_id"),
            body.get("rollout_id"),
        )
        return web.json_response(result)

    async def _models(self, request: web.Request) -> web.Response:
        self._session_for(request)
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model_name, "object": "model"}]}
        )

    # -- calls ------------------------------------------------------------------------------------------
    async def _openai_chat(self, request: web.Request) -> web.StreamResponse:
        s = self._session_for(request)
        body, json_cpu = await self._json_timed(request)
        if body.get("n", 1) != 1:
            raise RequestError("n: only n=1 is supported (send several requests for several samples)")
        cpu0 = time.thread_time()
        msgs = from_openai(body.get("messages"), s.message_cache)
        tools = validate_openai_tools(body.get("tools"))
        parse_cpu = json_cpu + time.thread_time() - cpu0
        max_tokens = (
            body.get("max_completion_tokens") or body.get("max_tokens") or self.config.default_max_tokens
        )
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop or []
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise RequestError("stop: expected a string or a list of strings")
        if body.get("stream"):
            sink = SSEReply(
                request,
                "openai",
                self.config.model_name,
                self.renderer.completion_text,
                stops,
                stream_options(body),
            )
            return await self._streamed(sink, s, msgs, tools, body, int(max_tokens), parse_cpu, stops)
        call_id, content, calls, finish, n_prompt, n_out = await self._call(
            s, msgs, tools, body, int(max_tokens), "openai", parse_cpu, stops
        )
        return web.json_response(
            fmt.openai_response(call_id, self.config.model_name, content, calls, finish, n_prompt, n_out),
            dumps=_dumps,
        )

    async def _anthropic_messages(self, request: web.Request) -> web.StreamResponse:
        s = self._session_for(request)
        body, json_cpu = await self._json_timed(request)
        cpu0 = time.thread_time()
        msgs = from_anthropic(body.get("system"), body.get("messages"))
        tools = anthropic_tools_to_openai(body.get("tools"))
        parse_cpu = json_cpu + time.thread_time() - cpu0
        if not isinstance(body.get("max_tokens"), int):
            raise RequestError("max_tokens: required integer (Anthropic Messages API)")
        stops = body.get("stop_sequences") or []
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise RequestError("stop_sequences: expected a list of strings")
        if body.get("stream"):
            sink = SSEReply(
                request, "anthropic", self.config.model_name, self.renderer.completion_text, stops
            )
            return await self._streamed(sink, s, msgs, tools, body, body["max_tokens"], parse_cpu, stops)
        call_id, content, calls, finish, n_prompt, n_out = await self._call(
            s, msgs, tools, body, body["max_tokens"], "anthropic", parse_cpu, stops
        )
        return web.json_response(
            fmt.anthropic_response(call_id, self.config.model_name, content, calls, finish, n_prompt, n_out),
            dumps=_dumps,
        )

    async def _streamed(
        self,
        sink: SSEReply,
        s: Session,
        msgs: list[Msg],
        tools: list[dict],
        body: dict,
        max_tokens: int,
        parse_cpu: float,
        stops: list[str],
    ) -> web.StreamResponse:
        """Text deltas reach the harness while the engine generates; tool calls and the end events follow
        once the call's record is durable. Errors before the first text are plain HTTP errors."""
        try:
            _, content, calls, finish, _, n_out = await self._call(
                s, msgs, tools, body, max_tokens, sink.api, parse_cpu, stops, sink
            )
        except (_HTTPError, RequestError) as e:
            if not sink.opened:
                raise
            return await sink.fail(e.message if isinstance(e, _HTTPError) else str(e))
        reply = await sink.finish(content, calls, finish, n_out)
        if sink.mismatch:
            self.metrics["stream_mismatch"] = self.metrics.get("stream_mismatch", 0) + 1
        return reply

    def _sampling(self, body: dict) -> SamplingParams:
        try:
            return SamplingParams(
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                seed=None if body.get("seed") is None else int(body["seed"]),
            )
        except (TypeError, ValueError):
            raise RequestError("temperature/top_p/seed: expected numbers") from None

    async def _call(
        self,
        s: Session,
        msgs: list[Msg],
        tools: list[dict],
        body: dict,
        max_tokens: int,
        api: str,
        parse_cpu: float = 0.0,
        stops: list[str] | None = None,
        sink: SSEReply | None = None,
    ) -> tuple:
        if s.status != "active":
            raise _HTTPError(
                409,
                "session_closed",
                f"session {s.session_id} is {s.status}" + (f": {s.reason}" if s.reason else ""),
            )
        if self._paused:
            self.metrics["rejected_paused"] += 1
            raise _HTTPError(
                429,
                "paused",
                "gateway paused for a weight update; retry later",
                {"Retry-After": str(self.config.retry_after_s)},
            )
        if max_tokens < 1:
            raise RequestError("max_tokens: must be >= 1")
        sampling = self._sampling(body)
        started = time.time()
        cpu0 = time.thread_time()
        plan = s.chains.plan(msgs, tools)  # reserves the chain until this call is committed or fails
        cpu_plan = time.thread_time() - cpu0
        me = asyncio.current_task()
        self._set_working(me, True)
        try:
            room = self.config.max_model_len - len(plan.prompt_ids)
            if room < max(self.config.min_new_tokens, 1):
                self.metrics["context_exhausted"] += 1
                await self._journal.append(
                    {
                        "type": "notice",
                        "session_id": s.session_id,
                        "kind": "context_exhausted",
                        "prompt_tokens": len(plan.prompt_ids),
                        "at": time.time(),
                    }
                )
                call_id = "ctx-" + uuid.uuid4().hex[:12]
                if sink is not None:
                    sink.begin(call_id, len(plan.prompt_ids))
                return call_id, "", [], "length", len(plan.prompt_ids), 0
            call_id = "c-" + uuid.uuid4().hex[:16]
            if sink is not None:
                sink.begin(call_id, len(plan.prompt_ids))
            t_engine = time.perf_counter()
            ids, lps, versions, finish = await self._generate(
                s, plan, sampling, min(max_tokens, room), sink.on_tokens if sink is not None else None
            )
            engine_s = time.perf_counter() - t_engine
            cpu1 = time.thread_time()
            text = self.renderer.completion_text(ids)
            if stops and any(x and x in text for x in stops):
                ids, lps, versions, text = self._cut_at_stop(ids, lps, versions, text, stops)
                finish = "stop"
            rec, content, calls = self._record(
                s, plan, msgs, tools, ids, lps, versions, finish, api, started, engine_s, text, call_id
            )
            # prompt building + record, without the sampled full re-render of the drift check (timed apart)
            rec["timings"]["gateway_cpu_s"] = (
                cpu_plan + time.thread_time() - cpu1 - rec["timings"]["drift_cpu_s"]
            )
            rec["timings"]["parse_cpu_s"] = parse_cpu  # JSON body + message conversion (O(request size))
            await self._journal.append(rec)  # durable before the harness sees the reply
            s.chains.commit(rec, plan)
            s.calls += 1
            self._count(plan, rec)
        finally:
            s.chains.release(plan)
            self._set_working(me, False)
        return rec["call_id"], content, calls, finish, rec["timings"]["prompt_tokens"], len(ids)

    async def _stream_into(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop: list[int],
        ids: list[int],
        lps: list[float],
        versions: list[int],
        on_tokens,
    ) -> Generation:
        """Consumes the engine's token stream into the call's lists (so tokens already shown to the harness
        survive a cancelling pause) and hands each step to `on_tokens`; returns an empty Generation holding
        the finish reason."""
        finish: str | None = None
        async for delta in generate_stream(self.engine, prompt, sampling, max_tokens, stop):
            ids += delta.token_ids
            lps += delta.logprobs
            versions += delta.token_policy_versions or [0] * len(delta.token_ids)
            if delta.token_ids:
                await on_tokens(ids)
            if delta.finish_reason is not None:
                finish = delta.finish_reason
                break
        if finish is None:
            raise EngineError("the engine's token stream ended without a finish_reason")
        return Generation(token_ids=[], logprobs=[], finish_reason=finish)

    async def _generate(
        self, s: Session, plan: CallPlan, sampling: SamplingParams, max_tokens: int, on_tokens=None
    ):
        """Runs the engine; across an aborting pause it resumes with the tokens sampled so far. With
        `on_tokens` (a streamed reply) the engine streams and each step is handed over as it arrives."""
        ids: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        stop = self.renderer.stop_token_ids
        me = asyncio.current_task()
        while True:
            if not self._resumed.is_set():  # parked by an aborting pause: not part of the drain
                self._set_working(me, False)
                await self._resumed.wait()
                self._set_working(me, True)
            prompt = plan.prompt_ids + ids if ids else plan.prompt_ids
            if on_tokens is None:
                task = asyncio.ensure_future(
                    self.engine.generate(prompt, sampling, max_tokens - len(ids), stop)
                )
            else:
                task = asyncio.ensure_future(
                    self._stream_into(
                        prompt, sampling, max_tokens - len(ids), stop, ids, lps, versions, on_tokens
                    )
                )
            self._in_flight.add(task)
            try:
                gen: Generation = await task
            except asyncio.CancelledError:
                if task in self._aborting and not asyncio.current_task().cancelling():
                    continue  # aborted for a weight update: wait for resume, then generate again
                raise
            except EngineError as e:
                await self._fail(s, str(e))
                status = 400 if isinstance(e, EngineRequestError) else 502
                raise _HTTPError(status, "engine_error", f"inference engine failed: {e}") from None
            except Exception as e:  # an engine bug is still an engine failure for the harness
                await self._fail(s, f"{type(e).__name__}: {e}")
                raise _HTTPError(
                    502, "engine_error", f"inference engine failed: {type(e).__name__}: {e}"
                ) from None
            finally:
                self._in_flight.discard(task)
                self._aborting.discard(task)
            ids += gen.token_ids
            lps += gen.logprobs
            versions += list(
                getattr(gen, "token_policy_versions", None) or [gen.policy_version] * len(gen.token_ids)
            )
            if gen.finish_reason == "abort" and len(ids) < max_tokens:
                self.metrics["aborted_generations"] += 1
                continue  # engine-side abort (weight sync): keep the partial tokens and continue after resume
            return ids, lps, versions, gen.finish_reason

    def _set_working(self, task: asyncio.Task, working: bool) -> None:
        if working:
            self._working.add(task)
            self._idle.clear()
        else:
            self._working.discard(task)
            if not self._working:
                self._idle.set()

    async def _fail(self, s: Session, reason: str) -> None:
        """An engine failure ends the rollout as failed (never trained as reward 0)."""
        self.metrics["calls_failed"] += 1
        await self._finish_session(s, "failed", f"engine error: {reason}")

    def _cut_at_stop(
        self, ids: list[int], lps: list[float], versions: list[int], text: str, stops: list[str]
    ):
        """Stop strings: keep the sampled tokens up to the one that completes the first stop string (they
        were sampled and stay in the chain); the harness gets the text before the stop string."""
        lo, hi = 1, len(ids)
        while lo < hi:  # shortest token prefix whose text contains a stop string
            mid = (lo + hi) // 2
            if any(x and x in self.renderer.decode(ids[:mid]) for x in stops):
                hi = mid
            else:
                lo = mid + 1
        shown = self.renderer.decode(ids[:lo])
        cut = min(shown.find(x) for x in stops if x and x in shown)
        return ids[:lo], lps[:lo], versions[:lo], shown[:cut]

    def _record(
        self,
        s: Session,
        plan: CallPlan,
        msgs: list[Msg],
        tools: list[dict],
        ids: list[int],
        lps: list[float],
        versions: list[int],
        finish: str,
        api: str,
        started: float,
        engine_s: float,
        text: str,
        call_id: str,
    ):
        content, calls = self.renderer.parse_completion(text)
        assistant = Msg("assistant", content, tuple(calls))
        close = self.renderer.close_assistant(ids)
        chain = plan.chain
        drift = None
        every = self.config.drift_check_every
        cpu0 = time.thread_time()
        if every and plan.op != "new" and chain.calls % every == 0:
            drift = self._drift(plan, msgs, tools)
        drift_cpu = time.thread_time() - cpu0
        rec = {
            "type": "call",
            "call_id": call_id,
            "session_id": s.session_id,
            "rollout_id": s.rollout_id,
            "group_id": s.group_id,
            "chain_id": chain.chain_id,
            "op": plan.op,
            "parent_chain_id": plan.parent_chain_id,
            "base_len": plan.base_len,
            "base_nodes": plan.base_nodes,
            "inherited_ids": plan.inherited_ids,
            "inherited_nodes": [n.to_json() for n in plan.inherited_nodes],
            "delta_ids": plan.delta_ids,
            "new_nodes": [n.to_json() for n in plan.new_nodes],
            "completion_ids": ids,
            "completion_logprobs": lps,
            "completion_versions": versions,
            "close_ids": close,
            "assistant_cum": s.chains.hasher.extend(plan.prompt_cum, assistant).hex(),
            "finish_reason": finish,
            "discarded_trainable": plan.discarded_trainable,
            "drift": drift,
            "api": api,
            "timings": {
                "started_at": started,
                "engine_s": engine_s,
                "prompt_tokens": len(plan.prompt_ids),
                "drift_cpu_s": drift_cpu,
            },
        }
        return rec, content, calls

    def _drift(self, plan: CallPlan, msgs: list[Msg], tools: list[dict]) -> str:
        """clean: a full re-render gives the same ids; realigned: same text, other token boundaries; forked: other text."""
        full = self.renderer.full_prompt(msgs, tools)
        if full == plan.prompt_ids:
            return "clean"
        if self.renderer.decode(full) == self.renderer.decode(plan.prompt_ids):
            return "realigned"
        return "forked"

    def _count(self, plan: CallPlan, rec: dict) -> None:
        self.metrics["calls"] += 1
        self.metrics[f"op_{plan.op}"] += 1
        self.metrics["discarded_trainable_tokens"] += plan.discarded_trainable
        self.metrics["gateway_cpu_s"] += rec["timings"]["gateway_cpu_s"]
        if rec["drift"]:
            self.metrics[f"drift_{rec['drift']}"] += 1
