"""Incremental SSE replies: text deltas go to the harness while the engine is still generating.

What is sent early is only text that is certain to be a prefix of the final `content` the non-streamed reply
would hold, so the concatenated stream equals the non-streamed text:
- an incomplete UTF-8 character (decoded as U+FFFD) waits for its remaining tokens;
- from the first tool-call marker (or a partial one at the end) on, text waits: tool calls are parsed once the
  completion is whole and sent at the end (their surrounding text may be stripped);
- trailing whitespace waits (the parser strips content around tool calls), and a reply that starts with
  whitespace is held until the end for the same reason;
- stop strings: text from a stop string on is never sent, and the last `len(stop) - 1` characters wait.
The call's journal record is appended (fsync) before the closing chunks and `[DONE]` are written. An OpenAI
stream opens with its first text; an Anthropic one with the first sampled token (message_start, ping), and pings
while text is held back; a Responses one (Codex) with the first sampled token too (response.created,
response.in_progress), and ends with response.completed (or response.failed) and no `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from harnessrl.engine.base import FinishReason

from . import api_formats as fmt
from .enums import Api
from .toolcalls import ToolCall

if TYPE_CHECKING:
    from .calls import CallResult

TOOL_MARKERS = ("<tool_call>", "<function=")
PING_EVERY_S = 10.0  # Anthropic streams: a ping while text is held back (Claude Code's idle watchdog: 300 s)


def safe_prefix(text: str, stops: list[str]) -> str:
    """The longest prefix of `text` that no later token can change in the final content."""
    cut = len(text)
    bad = text.find("\ufffd")
    if bad >= 0:
        cut = bad
    for marker in (*TOOL_MARKERS, *(x for x in stops if x)):
        at = text.find(marker)
        if at >= 0:
            cut = min(cut, at)
        else:  # a marker may be starting at the end of the text
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    cut = min(cut, len(text) - k)
                    break
    prefix = text[:cut]
    if prefix[:1].isspace():
        return ""
    return prefix.rstrip()


class SSEReply:
    """One streamed chat reply (OpenAI chunks or Anthropic events); the response opens with the first text."""

    def __init__(
        self,
        request: web.Request,
        api: Api,
        model: str,
        decode: Callable[[list[int]], str],
        stops: list[str],
        include_usage: bool = False,
        shape: fmt.ResponsesShape | None = None,
        interval_s: float = 0.0,
    ) -> None:
        self.request, self.api, self.model = request, api, model
        self.interval_s = interval_s  # text events at most this often (GatewayConfig.stream_interval_ms)
        self.shape = shape  # the Responses API's reply (Api.RESPONSES)
        self.result: CallResult | None = None  # the call, once it is recorded
        self.decode = decode  # sampled ids -> completion text (stop token dropped)
        self.stops = stops
        self.include_usage = include_usage
        self.call_id = ""
        self.prompt_tokens = 0
        self.sent = ""
        self.response: web.StreamResponse | None = None
        self.text_block_open = False
        self.mismatch = False
        self.last_write = 0.0

    def begin(self, call_id: str, prompt_tokens: int) -> None:
        self.call_id, self.prompt_tokens = call_id, prompt_tokens
        if self.shape is not None:
            self.shape.call_id = call_id

    @property
    def opened(self) -> bool:
        return self.response is not None

    async def _write(self, data: bytes) -> web.StreamResponse:
        # shielded: an aborting pause cancels the generation task, never half an SSE event (nor the head)
        return await asyncio.shield(self._send(data))

    async def _send(self, data: bytes) -> web.StreamResponse:
        response = self.response
        if response is None:
            response = self.response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(self.request)
            if self.api is Api.OPENAI:
                data = fmt.openai_stream_head(self.call_id, self.model) + data
            elif self.shape is not None:
                pass  # its head is made with the first event (`_responses`): sequence numbers in order
            else:
                data = fmt.anthropic_stream_head(self.call_id, self.model, self.prompt_tokens) + data
        await response.write(data)
        self.last_write = time.monotonic()
        return response

    def _responses(self, make: Callable[[fmt.ResponsesShape], bytes]) -> bytes:
        """A Responses stream's next events, after its head (response.created, response.in_progress) when
        nothing was sent yet."""
        shape = self.shape
        assert shape is not None
        head = b"" if shape.seq else shape.head()
        return head + make(shape)

    async def _text(self, text: str) -> None:
        if not text:
            return
        # counted as sent before the write is awaited: the write finishes even when an aborting pause cancels
        # this call meanwhile (shielded), and the text sent after the resume must not repeat it
        self.sent += text
        if self.api is Api.OPENAI:
            await self._write(fmt.openai_stream_text(self.call_id, self.model, text))
        elif self.shape is not None:
            await self._write(self._responses(lambda shape: shape.text_delta(text)))
        else:
            head = b"" if self.text_block_open else fmt.anthropic_text_start()
            self.text_block_open = True
            await self._write(head + fmt.anthropic_text_delta(text))

    async def on_tokens(self, ids: list[int]) -> None:
        """Called with all ids sampled so far, after each engine delta. New text goes out once `interval_s` has
        passed since the last write (at once when nothing was sent yet). An Anthropic stream opens with the
        first token (message_start, as the API sends it once it generates), and while text is held back (a tool
        call being generated) a ping goes out every PING_EVERY_S, so a client's idle timeout never fires."""
        safe = safe_prefix(self.decode(ids), self.stops)
        grown = len(safe) > len(self.sent) and safe.startswith(self.sent)
        if grown and (self.response is None or time.monotonic() - self.last_write >= self.interval_s):
            await self._text(safe[len(self.sent) :])
        elif self.api is Api.ANTHROPIC and (
            self.response is None or time.monotonic() - self.last_write >= PING_EVERY_S
        ):
            await self._write(b"" if self.response is None else fmt.anthropic_ping())
        elif self.shape is not None and self.response is None:
            # opens with the first token: response.created, response.in_progress
            await self._write(self._responses(lambda shape: b""))

    async def finish(
        self, content: str, calls: list[ToolCall], finish: FinishReason, completion_tokens: int
    ) -> web.StreamResponse:
        """The rest of the content, the tool calls, the end events. Call after the record is durable."""
        if content.startswith(self.sent):
            rest = content[len(self.sent) :]
        else:  # cannot happen for the parsers we ship; the harness keeps what it already got
            rest, self.mismatch = "", True
        if self.shape is not None:
            await self._write(self._responses(lambda shape: shape.text_delta(rest) if rest else b""))
            tail = self.shape.tail(content, calls, finish, self.prompt_tokens, completion_tokens)
        elif self.api is Api.OPENAI:
            await self._write(fmt.openai_stream_text(self.call_id, self.model, rest) if rest else b"")
            tail = fmt.openai_stream_tail(
                self.call_id,
                self.model,
                calls,
                finish,
                self.prompt_tokens,
                completion_tokens,
                self.include_usage,
            )
        else:
            if rest or (not calls and not self.text_block_open):
                if not self.text_block_open:
                    await self._write(fmt.anthropic_text_start())
                    self.text_block_open = True
                if rest:
                    await self._write(fmt.anthropic_text_delta(rest))
            tail = fmt.anthropic_stream_tail(
                self.call_id, calls, finish, completion_tokens, self.text_block_open
            )
        response = await self._write(b"".join(tail))
        await _end(response)
        return response

    async def fail(self, message: str, code: str = "server_error") -> web.StreamResponse:
        """An error after the stream has opened: an error event, then the stream ends."""
        if self.shape is not None:
            data = self._responses(lambda shape: shape.failed(message, code))
        elif self.api is Api.OPENAI:
            data = fmt.openai_stream_error(message)
        else:
            data = fmt.anthropic_stream_error(message)
        response = await self._write(data)
        await _end(response)
        return response


async def _end(response: web.StreamResponse) -> None:
    # SDKs close the connection once they read the last event; the record is durable by then
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
