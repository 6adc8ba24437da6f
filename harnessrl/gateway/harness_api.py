"""The routes harnesses call: OpenAI Chat Completions and Anthropic Messages, per session.

POST /sessions/{sid}/v1/chat/completions   (Authorization: Bearer <api_key>)
POST /sessions/{sid}/v1/messages           (x-api-key: <api_key> or Bearer)
GET  /sessions/{sid}/v1/models
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web

from . import api_formats as fmt
from .bodies import Offload, read_json
from .calls import CallRequest, CallRunner
from .config import GatewayConfig
from .enums import Api
from .errors import HTTPError
from .journal import JournalWriteError
from .messages import (
    Msg,
    RequestError,
    anthropic_tools_to_openai,
    from_anthropic,
    from_openai,
    validate_openai_tools,
)
from .metrics import GatewayMetrics
from .params import anthropic_params, openai_params
from .render import ChatRenderer
from .sessions import Session, SessionStore
from .streaming import SSEReply

logger = logging.getLogger(__name__)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class HarnessAPI:
    def __init__(
        self,
        sessions: SessionStore,
        calls: CallRunner,
        renderer: ChatRenderer,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        offload: Offload,
    ) -> None:
        self.sessions, self.calls, self.renderer, self.config = sessions, calls, renderer, config
        self.metrics, self.offload = metrics, offload

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
        body, json_cpu, large = await read_json(request, self.config, self.offload)
        params = openai_params(body, self.config)

        def convert() -> tuple[list[Msg], list[dict[str, Any]]]:
            return from_openai(body.get("messages"), s.message_cache), validate_openai_tools(
                body.get("tools")
            )

        req = CallRequest(Api.OPENAI, params, convert, json_cpu, large)
        if params.stream:
            sink = SSEReply(
                request,
                Api.OPENAI,
                self.config.model_name,
                self.renderer.completion_text,
                params.stops,
                params.include_usage,
            )
            return await self._streamed(sink, s, req)
        r = await self.calls.run(s, req)
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
        body, json_cpu, large = await read_json(request, self.config, self.offload)
        params = anthropic_params(body)

        def convert() -> tuple[list[Msg], list[dict[str, Any]]]:
            return from_anthropic(body.get("system"), body.get("messages")), anthropic_tools_to_openai(
                body.get("tools")
            )

        req = CallRequest(Api.ANTHROPIC, params, convert, json_cpu, large)
        if params.stream:
            sink = SSEReply(
                request, Api.ANTHROPIC, self.config.model_name, self.renderer.completion_text, params.stops
            )
            return await self._streamed(sink, s, req)
        r = await self.calls.run(s, req)
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

    async def _streamed(self, sink: SSEReply, s: Session, req: CallRequest) -> web.StreamResponse:
        """Text deltas reach the harness while the engine generates; tool calls and the end events follow
        once the call's record is durable. Errors before the first text are plain HTTP errors; after it, an
        error event ends the stream."""
        try:
            r = await self.calls.run(s, req, sink)
        except Exception as e:
            if not sink.opened:
                raise
            if isinstance(e, HTTPError):
                message = e.message
            elif isinstance(e, RequestError | JournalWriteError):
                message = str(e)
            else:
                logger.exception("streamed call of session %s failed", s.session_id)
                message = f"internal gateway error: {type(e).__name__}: {e}"
            return await sink.fail(message)
        reply = await sink.finish(r.content, r.tool_calls, r.finish_reason, r.completion_tokens)
        if sink.mismatch:
            self.metrics.stream_mismatch += 1
        return reply
