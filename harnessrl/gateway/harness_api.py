"""The routes harnesses call: OpenAI Chat Completions and Anthropic Messages, per session.

POST /sessions/{sid}/v1/chat/completions   (Authorization: Bearer <api_key>)
POST /sessions/{sid}/v1/messages           (x-api-key: <api_key> or Bearer)
POST /sessions/{sid}/v1/messages/count_tokens   (the prompt's length in the policy's tokens; nothing recorded)
POST /sessions/{sid}/v1/responses          (OpenAI Responses: Codex; Bearer <api_key>)
GET  /sessions/{sid}/v1/models
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
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
    argument_defaults,
    from_anthropic,
    from_openai,
    from_responses,
    responses_request_tools,
    responses_tools_to_openai,
    same_actions,
    validate_openai_tools,
)
from .metrics import GatewayMetrics
from .params import anthropic_params, openai_params, responses_params
from .render import ChatRenderer
from .sessions import Session, SessionStore
from .streaming import SSEReply

logger = logging.getLogger(__name__)
# Responses stored for `previous_response_id` (requests with `store` not false), across sessions, newest kept
STORED_RESPONSES = 4096


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
        self._stream_interval_s = config.stream_interval_ms / 1000
        # (session id, response id) -> the conversation that response ended (its input and its reply)
        self.stored: OrderedDict[tuple[str, str], list[Msg]] = OrderedDict()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/sessions/{sid}/v1/chat/completions", self.openai_chat)
        router.add_post("/sessions/{sid}/v1/messages", self.anthropic_messages)
        router.add_post("/sessions/{sid}/v1/messages/count_tokens", self.anthropic_count_tokens)
        router.add_post("/sessions/{sid}/v1/responses", self.openai_responses)
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
                interval_s=self._stream_interval_s,
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
                request,
                Api.ANTHROPIC,
                self.config.model_name,
                self.renderer.completion_text,
                params.stops,
                interval_s=self._stream_interval_s,
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

    async def openai_responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI Responses (what Codex speaks): `input` items and `instructions` in, output items out (text as a
        `message`, tool calls as `function_call` / `custom_tool_call` items), recorded like any call. A
        `previous_response_id` continues a stored response's conversation (one whose request did not say
        `store: false`)."""
        s = self.sessions.authenticated(request)
        body, json_cpu, large = await read_json(request, self.config, self.offload)
        params = responses_params(body, self.config)
        previous = body.get("previous_response_id")
        history: list[Msg] = []
        if previous is not None:
            found = self.stored.get((s.session_id, str(previous)))
            if found is None:
                raise HTTPError(
                    400,
                    "invalid_request_error",
                    f"Previous response with id {previous!r} not found.",
                    code="previous_response_not_found",
                )
            history = found
        tools, kinds = responses_tools_to_openai(
            responses_request_tools(body.get("tools"), body.get("input"))
        )
        converted: list[list[Msg]] = []

        def convert() -> tuple[list[Msg], list[dict[str, Any]]]:
            if not history:
                msgs = from_responses(body.get("instructions"), body.get("input"))
                converted.append(msgs[1:] if body.get("instructions") else msgs)
                return msgs, tools
            # this request's instructions (a previous response's are not carried over), the conversation so
            # far, this request's items
            items = from_responses(None, body.get("input")) if body.get("input") else []
            converted.append([*history, *items])
            instructions = from_responses(body["instructions"], [])[:1] if body.get("instructions") else []
            return [*instructions, *converted[-1]], tools

        req = CallRequest(Api.RESPONSES, params, convert, json_cpu, large)
        shape = fmt.ResponsesShape(body, self.config.model_name, kinds)
        if params.stream:
            sink = SSEReply(
                request,
                Api.RESPONSES,
                self.config.model_name,
                self.renderer.completion_text,
                [],
                shape=shape,
                interval_s=self._stream_interval_s,
            )
            reply = await self._streamed(sink, s, req)
            result = sink.result
        else:
            result = await self.calls.run(s, req)
            shape.call_id = result.call_id
            reply = web.json_response(
                shape.final(
                    result.content,
                    result.tool_calls,
                    result.finish_reason,
                    result.prompt_tokens,
                    result.completion_tokens,
                ),
                dumps=_dumps,
            )
        if result is not None and converted and body.get("store") is not False:
            reply_msg = Msg("assistant", result.content, tuple(result.tool_calls))
            self.stored[(s.session_id, shape.response_id)] = [*converted[-1], reply_msg]
            while len(self.stored) > STORED_RESPONSES:
                self.stored.popitem(last=False)
        return reply

    async def anthropic_count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's token counting: the prompt a call with this body would send, rendered whole with the
        policy's template (a chain's exact tokens may differ by a few at re-tokenized boundaries); no engine
        call, no record."""
        self.sessions.authenticated(request)
        body, _, large = await read_json(request, self.config, self.offload)

        def count() -> int:
            msgs = from_anthropic(body.get("system"), body.get("messages"))
            tools = anthropic_tools_to_openai(body.get("tools"))
            return len(self.renderer.full_prompt(same_actions(msgs, argument_defaults(tools)), tools))

        return web.json_response({"input_tokens": await self.offload.run(large, count)})

    async def _streamed(self, sink: SSEReply, s: Session, req: CallRequest) -> web.StreamResponse:
        """Text deltas reach the harness while the engine generates; tool calls and the end events follow
        once the call's record is durable. Errors before the stream opens (OpenAI: the first text; Anthropic:
        the first token) are plain HTTP errors; after it, an error event ends the stream."""
        try:
            r = await self.calls.run(s, req, sink)
        except Exception as e:
            if (
                sink.shape is not None
                and isinstance(e, HTTPError)
                and e.code == fmt.CONTEXT_LENGTH_EXCEEDED
                and not sink.opened
            ):  # as the Responses API streams it: created, in_progress, failed (code context_length_exceeded)
                sink.begin("ctx-" + uuid.uuid4().hex[:12], 0)
                return await sink.fail(e.message, e.code)
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
        sink.result = r
        reply = await sink.finish(r.content, r.tool_calls, r.finish_reason, r.completion_tokens)
        if sink.mismatch:
            self.metrics.stream_mismatch += 1
        return reply
