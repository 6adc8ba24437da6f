"""Response bodies and SSE event streams of the OpenAI Chat Completions and Anthropic Messages APIs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from .toolcalls import ToolCall

OPENAI_FINISH = {"stop": "stop", "length": "length", "abort": "stop"}
ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn"}


def _openai_calls(call_id: str, calls: list[ToolCall]) -> list[dict]:
    return [
        {
            "id": f"call_{call_id[-8:]}_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for i, c in enumerate(calls)
    ]


def openai_finish(finish: str, calls: list[ToolCall]) -> str:
    if calls and finish == "stop":
        return "tool_calls"
    return OPENAI_FINISH.get(finish, finish)


def openai_response(
    call_id: str,
    model: str,
    content: str,
    calls: list[ToolCall],
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = _openai_calls(call_id, calls)
    return {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": openai_finish(finish, calls), "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _openai_base(call_id: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }


def _openai_chunk(call_id: str, model: str, delta: dict, finish_reason: str | None = None) -> bytes:
    return _sse(
        {
            **_openai_base(call_id, model),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
    )


def openai_stream_head(call_id: str, model: str) -> bytes:
    return _openai_chunk(call_id, model, {"role": "assistant", "content": ""})


def openai_stream_text(call_id: str, model: str, text: str) -> bytes:
    return _openai_chunk(call_id, model, {"content": text})


def openai_stream_tail(
    call_id: str,
    model: str,
    calls: list[ToolCall],
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
    include_usage: bool,
) -> Iterator[bytes]:
    """Tool-call chunks (parsed once the completion is whole), the finish chunk, usage, [DONE]."""
    for i, tc in enumerate(_openai_calls(call_id, calls)):
        yield _openai_chunk(call_id, model, {"tool_calls": [{"index": i, **tc}]})
    yield _openai_chunk(call_id, model, {}, openai_finish(finish, calls))
    if include_usage:
        yield _sse(
            {
                **_openai_base(call_id, model),
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )
    yield b"data: [DONE]\n\n"


def openai_stream_error(message: str) -> bytes:
    return _sse({"error": {"type": "engine_error", "message": message}}) + b"data: [DONE]\n\n"


def anthropic_blocks(call_id: str, content: str, calls: list[ToolCall]) -> list[dict]:
    blocks: list[dict] = []
    if content or not calls:
        blocks.append({"type": "text", "text": content})
    for i, c in enumerate(calls):
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{call_id[-8:]}_{i}", "name": c.name, "input": c.arguments}
        )
    return blocks


def anthropic_stop(finish: str, calls: list[ToolCall]) -> str:
    if calls and finish == "stop":
        return "tool_use"
    return ANTHROPIC_STOP.get(finish, finish)


def anthropic_response(
    call_id: str,
    model: str,
    content: str,
    calls: list[ToolCall],
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    return {
        "id": f"msg_{call_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": anthropic_blocks(call_id, content, calls),
        "stop_reason": anthropic_stop(finish, calls),
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": completion_tokens,
        },
    }


def _event(name: str, obj: dict) -> bytes:
    return f"event: {name}\n".encode() + _sse(obj)


def anthropic_stream_head(call_id: str, model: str, prompt_tokens: int) -> bytes:
    """message_start, then a ping, as Anthropic's API opens every stream."""
    msg = anthropic_response(call_id, model, "", [], "stop", prompt_tokens, 0)
    msg.update(content=[], stop_reason=None)
    return _event("message_start", {"type": "message_start", "message": msg}) + anthropic_ping()


def anthropic_ping() -> bytes:
    return _event("ping", {"type": "ping"})


def anthropic_text_start() -> bytes:
    return _event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )


def anthropic_text_delta(text: str) -> bytes:
    return _event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def anthropic_stream_tail(
    call_id: str, calls: list[ToolCall], finish: str, completion_tokens: int, text_block_open: bool
) -> Iterator[bytes]:
    """Closes the text block (index 0) when one is open, then tool_use blocks, message_delta, message_stop."""
    index = 0
    if text_block_open:
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    for block in anthropic_blocks(call_id, "", calls)[(0 if calls else 1) :]:
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
        )
        yield _event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
            },
        )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": anthropic_stop(finish, calls), "stop_sequence": None},
            "usage": {"output_tokens": completion_tokens},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def anthropic_stream_error(message: str) -> bytes:
    return _event("error", {"type": "error", "error": {"type": "api_error", "message": message}})


# -- OpenAI Responses ---------------------------------------------------------------------------------------------
RESPONSES_ECHOED = (  # request fields a Response object repeats
    "instructions",
    "max_output_tokens",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "metadata",
    "prompt_cache_key",
)
# What the Responses API says when the prompt does not fit (Codex reads `code` of a failed stream as a full
# context window)
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTEXT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


class ResponsesShape:
    """One reply of the OpenAI Responses API: the Response object and its SSE events (each with its
    `sequence_number`), in the order the API sends them: response.created, response.in_progress; per output
    item output_item.added, its parts (content_part.added / output_text.delta / output_text.done /
    content_part.done; function_call_arguments.delta / .done; custom_tool_call_input.delta / .done),
    output_item.done; then response.completed (response.incomplete when cut at the token limit) or
    response.failed. `kinds` maps a tool name to its item type (function_call | custom_tool_call)."""

    def __init__(self, body: dict[str, Any], model: str, kinds: dict[str, str]) -> None:
        self.model, self.kinds = model, kinds
        self.echo = {k: body.get(k) for k in RESPONSES_ECHOED}
        self.echo["tools"] = body.get("tools") or []
        self.echo["metadata"] = body.get("metadata") or {}
        self.created_at = int(time.time())
        self.call_id = ""
        self.seq = 0
        self.text_open = False

    @property
    def response_id(self) -> str:
        return f"resp_{self.call_id}"

    def _message_id(self) -> str:
        return f"msg_{self.call_id}"

    def response(
        self,
        status: str,
        output: list[dict],
        usage: dict | None = None,
        error: dict | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def message_item(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {
            "id": self._message_id(),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content if status == "completed" else [],
        }

    def call_item(self, i: int, call: ToolCall, status: str = "completed") -> dict[str, Any]:
        done = status == "completed"
        item: dict[str, Any] = {"id": f"fc_{self.call_id}_{i}", "status": status}
        call_id = f"call_{self.call_id[-8:]}_{i}"
        if self.kinds.get(call.name) == "custom_tool_call":
            raw = call.arguments.get("input")
            text = raw if isinstance(raw, str) else json.dumps(call.arguments, ensure_ascii=False)
            item.update(type="custom_tool_call", call_id=call_id, name=call.name, input=text if done else "")
        else:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            item.update(
                type="function_call", call_id=call_id, name=call.name, arguments=arguments if done else ""
            )
        return item

    def output(self, content: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
        items = [self.message_item(content)] if content or not calls else []
        return items + [self.call_item(i, c) for i, c in enumerate(calls)]

    def final(
        self, content: str, calls: list[ToolCall], finish: str, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The whole Response (non-streamed, and inside the closing event)."""
        cut = finish == "length"
        return self.response(
            "incomplete" if cut else "completed",
            self.output(content, calls),
            self.usage(prompt_tokens, completion_tokens),
            incomplete="max_output_tokens" if cut else None,
        )

    # -- SSE ------------------------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\n".encode() + _sse(data)

    def head(self) -> bytes:
        r = self.response("in_progress", [])
        return self.event("response.created", response=r) + self.event("response.in_progress", response=r)

    def _text_part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def text_delta(self, text: str) -> bytes:
        """A delta of the message's text; the first one opens the message item and its text part."""
        head = b""
        if not self.text_open:
            self.text_open = True
            head = self.event(
                "response.output_item.added", output_index=0, item=self.message_item("", "in_progress")
            ) + self.event(
                "response.content_part.added",
                item_id=self._message_id(),
                output_index=0,
                content_index=0,
                part=self._text_part(""),
            )
        return head + self.event(
            "response.output_text.delta",
            item_id=self._message_id(),
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def tail(
        self, content: str, calls: list[ToolCall], finish: str, prompt_tokens: int, completion_tokens: int
    ) -> Iterator[bytes]:
        """Closes the message item (opened by a text delta, or here when the reply is text only), then each
        tool call as its own item, then response.completed / response.incomplete with the whole Response."""
        index = 0
        if self.text_open or not calls:
            if not self.text_open:
                yield self.text_delta("")
            mid = self._message_id()
            yield self.event(
                "response.output_text.done",
                item_id=mid,
                output_index=0,
                content_index=0,
                text=content,
                logprobs=[],
            )
            yield self.event(
                "response.content_part.done",
                item_id=mid,
                output_index=0,
                content_index=0,
                part=self._text_part(content),
            )
            yield self.event("response.output_item.done", output_index=0, item=self.message_item(content))
            index = 1
        for i, call in enumerate(calls):
            done = self.call_item(i, call)
            yield self.event(
                "response.output_item.added", output_index=index, item=self.call_item(i, call, "in_progress")
            )
            if done["type"] == "custom_tool_call":
                yield self.event(
                    "response.custom_tool_call_input.delta",
                    item_id=done["id"],
                    output_index=index,
                    delta=done["input"],
                )
                yield self.event(
                    "response.custom_tool_call_input.done",
                    item_id=done["id"],
                    output_index=index,
                    input=done["input"],
                )
            else:
                yield self.event(
                    "response.function_call_arguments.delta",
                    item_id=done["id"],
                    output_index=index,
                    delta=done["arguments"],
                )
                yield self.event(
                    "response.function_call_arguments.done",
                    item_id=done["id"],
                    output_index=index,
                    name=call.name,
                    arguments=done["arguments"],
                )
            yield self.event("response.output_item.done", output_index=index, item=done)
            index += 1
        final = self.final(content, calls, finish, prompt_tokens, completion_tokens)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self.event(kind, response=final)

    def failed(self, message: str, code: str = "server_error") -> bytes:
        """The stream's end when the call failed after it opened (or a full context: `code`
        context_length_exceeded, as the API sends it)."""
        error = {"code": code, "message": message}
        return self.event("response.failed", response=self.response("failed", [], error=error))
