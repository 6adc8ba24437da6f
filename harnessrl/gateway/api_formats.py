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
        "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
    }


def _event(name: str, obj: dict) -> bytes:
    return f"event: {name}\n".encode() + _sse(obj)


def anthropic_stream_head(call_id: str, model: str, prompt_tokens: int) -> bytes:
    msg = anthropic_response(call_id, model, "", [], "stop", prompt_tokens, 0)
    msg.update(content=[], stop_reason=None)
    return _event("message_start", {"type": "message_start", "message": msg})


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
