"""The routes harnesses call: OpenAI Chat Completions and Anthropic Messages, per session.

POST /sessions/{sid}/v1/chat/completions   (Authorization: Bearer <api_key>)
POST /sessions/{sid}/v1/messages           (x-api-key: <api_key> or Bearer)
GET  /sessions/{sid}/v1/models
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from harnessrl.engine.base import SamplingParams

from . import api_formats as fmt
from .bodies import read_json
from .calls import CallParams, CallRunner
from .config import GatewayConfig
from .enums import Api
from .errors import HTTPError
from .messages import (
    Msg,
    RequestError,
    anthropic_tools_to_openai,
    from_anthropic,
    from_openai,
    validate_openai_tools,
)
from .metrics import GatewayMetrics
from .render import ChatRenderer
from .sessions import Session, SessionStore
from .streaming import SSEReply, stream_options


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _sampling(body: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            seed=None if body.get("seed") is None else int(body["seed"]),
        )
    except (TypeError, ValueError):
        raise RequestError("temperature/top_p/seed: expected numbers") from None


def _stops(value: Any, field: str) -> list[str]:
    stops = [value] if isinstance(value, str) else value or []
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise RequestError(f"{field}: expected a string or a list of strings")
    return stops


class HarnessAPI:
    def __init__(
        self,
        sessions: SessionStore,
        calls: CallRunner,
        renderer: ChatRenderer,
        config: GatewayConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.sessions, self.calls, self.renderer, self.config, self.metrics = (
            sessions,
            calls,
            renderer,
            config,
            metrics,
        )

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/sessions/{sid}/v1/chat/completions", self.openai_chat)
        router.add_post("/sessions/{sid}/v1/messages", self.anthropic_messages)
        router.add_get("/sessions/{sid}/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        self.sessions.authenticated(request)
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model_name, "object": "model"}]}
        )

    async def openai_chat(self, request: web.Request) -> web.StreamResponse:
        s = self.sessions.authenticated(request)
        body, json_cpu = await read_json(request)
        if body.get("n", 1) != 1:
            raise RequestError("n: only n=1 is supported (send several requests for several samples)")
        cpu0 = time.thread_time()
        msgs = from_openai(body.get("messages"), s.message_cache)
        tools = validate_openai_tools(body.get("tools"))
        parse_cpu = json_cpu + time.thread_time() - cpu0
        max_tokens = (
            body.get("max_completion_tokens") or body.get("max_tokens") or self.config.default_max_tokens
        )
        stops = _stops(body.get("stop"), "stop")
        if int(max_tokens) < 1:
            raise RequestError("max_tokens: must be >= 1")
        params = CallParams(int(max_tokens), _sampling(body), stops)
        if body.get("stream"):
            sink = SSEReply(
                request,
                Api.OPENAI,
                self.config.model_name,
                self.renderer.completion_text,
                stops,
                stream_options(body),
            )
            return await self._streamed(sink, s, msgs, tools, params, parse_cpu)
        r = await self.calls.run(s, msgs, tools, params, Api.OPENAI, parse_cpu)
        reply = fmt.openai_response(
            r.call_id,
            self.config.model_name,
            r.content,
            r.tool_calls,
            r.finish_reason,
            r.prompt_tokens,
            r.completion_tokens,
        )
        return web.json_response(reply, dumps=_dumps)

    async def anthropic_messages(self, request: web.Request) -> web.StreamResponse:
        s = self.sessions.authenticated(request)
        body, json_cpu = await read_json(request)
        cpu0 = time.thread_time()
        msgs = from_anthropic(body.get("system"), body.get("messages"))
        tools = anthropic_tools_to_openai(body.get("tools"))
        parse_cpu = json_cpu + time.thread_time() - cpu0
        if not isinstance(body.get("max_tokens"), int):
            raise RequestError("max_tokens: required integer (Anthropic Messages API)")
        stops = _stops(body.get("stop_sequences"), "stop_sequences")
        if body["max_tokens"] < 1:
            raise RequestError("max_tokens: must be >= 1")
        params = CallParams(body["max_tokens"], _sampling(body), stops)
        if body.get("stream"):
            sink = SSEReply(
                request, Api.ANTHROPIC, self.config.model_name, self.renderer.completion_text, stops
            )
            return await self._streamed(sink, s, msgs, tools, params, parse_cpu)
        r = await self.calls.run(s, msgs, tools, params, Api.ANTHROPIC, parse_cpu)
        reply = fmt.anthropic_response(
            r.call_id,
            self.config.model_name,
            r.content,
            r.tool_calls,
            r.finish_reason,
            r.prompt_tokens,
            r.completion_tokens,
        )
        return web.json_response(reply, dumps=_dumps)

    async def _streamed(
        self,
        sink: SSEReply,
        s: Session,
        msgs: list[Msg],
        tools: list[dict[str, Any]],
        params: CallParams,
        parse_cpu: float,
    ) -> web.StreamResponse:
        """Text deltas reach the harness while the engine generates; tool calls and the end events follow
        once the call's record is durable. Errors before the first text are plain HTTP errors."""
        try:
            r = await self.calls.run(s, msgs, tools, params, sink.api, parse_cpu, sink)
        except (HTTPError, RequestError) as e:
            if not sink.opened:
                raise
            return await sink.fail(e.message if isinstance(e, HTTPError) else str(e))
        reply = await sink.finish(r.content, r.tool_calls, r.finish_reason, r.completion_tokens)
        if sink.mismatch:
            self.metrics.stream_mismatch += 1
        return reply
