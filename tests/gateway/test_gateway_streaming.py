"""Incremental SSE: text reaches the harness while the engine is still generating (fast engine with a
per-token delay streams token by token over real loopback HTTP), the streamed text equals the non-streamed
text, and the journal record is the same and durable before the stream ends."""

from __future__ import annotations

import contextlib
import json
import time

import anthropic
import openai
import pytest
from anthropic.types import Message, MessageParam

from harnessrl.engine.base import FinishReason
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.records import CallRecord
from harnessrl.gateway.streaming import safe_prefix
from tests.gateway.support import Messages, call_records

LONG_REPLY = (
    "Let me think about this step by step. " * 5
    + "Résumé: naïve café, 日本語のテキスト, emoji 😀🚀 and ✓ done."
)
SAME_FIELDS = (
    "op",
    "api",
    "delta_ids",
    "completion_ids",
    "completion_logprobs",
    "completion_versions",
    "close_ids",
    "finish_reason",
    "assistant_cum",
    "discarded_trainable",
)
MSGS: Messages = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Explain."},
]


def _calls(journal_dir) -> list[CallRecord]:
    return call_records(journal_dir)


def _anthropic_text(message: Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def _same(a: CallRecord, b: CallRecord) -> dict:
    return {k: (getattr(a, k), getattr(b, k)) for k in SAME_FIELDS if getattr(a, k) != getattr(b, k)}


def test_safe_prefix_holds_back_what_later_tokens_can_change():
    assert safe_prefix("Hello wor", []) == "Hello wor"
    assert safe_prefix("Hello \ufffd", []) == "Hello"  # an incomplete UTF-8 character
    assert (
        safe_prefix("I will run it.\n<tool_c", []) == "I will run it."
    )  # a tool-call marker may be starting
    assert safe_prefix("ok <tool_call>{", []) == "ok"
    assert safe_prefix("a < b and", []) == "a < b and"  # a lone '<' is not a marker
    assert safe_prefix("one two STO", ["STOP"]) == "one two"  # a stop string may be starting
    assert safe_prefix("one STOP two", ["STOP"]) == "one"
    assert safe_prefix("  indented", []) == ""  # leading whitespace: stripped if tool calls follow


@pytest.mark.parametrize("stop", [None, ["naïve"]])
def test_openai_stream_arrives_incrementally_and_matches_non_streamed(gateway, fast_engine, stop):
    engine = fast_engine([{"text": LONG_REPLY}], per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url), stream_interval_ms=0)
    plain_s, stream_s = admin.create_session("r-plain", "t"), admin.create_session("r-stream", "t")
    plain = openai.OpenAI(base_url=plain_s.openai_base_url, api_key=plain_s.api_key, max_retries=0)
    streamed = openai.OpenAI(base_url=stream_s.openai_base_url, api_key=stream_s.api_key, max_retries=0)
    whole = plain.chat.completions.create(model="p", messages=MSGS, max_tokens=300, stop=stop)

    t0 = time.perf_counter()
    arrivals: list[float] = []
    pieces: list[str] = []
    records_at_finish: list[CallRecord] = []
    finish = None
    for chunk in streamed.chat.completions.create(
        model="p", messages=MSGS, max_tokens=300, stream=True, stop=stop
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - t0)
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            records_at_finish = _calls(g.journal_dir)  # durable before the final chunk was sent
            finish = chunk.choices[0].finish_reason
    end = time.perf_counter() - t0

    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert len(pieces) >= 10
    assert arrivals[0] < 0.3 * end  # the first text came long before generation ended
    assert len(records_at_finish) == 2
    plain_rec, stream_rec = _calls(g.journal_dir)
    assert stream_rec.session_id == stream_s.session_id
    assert _same(plain_rec, stream_rec) == {}


def test_anthropic_stream_arrives_incrementally_and_matches_non_streamed(gateway, fast_engine):
    engine = fast_engine([{"text": LONG_REPLY}], per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url), stream_interval_ms=0)
    plain_s, stream_s = admin.create_session("r-plain", "t"), admin.create_session("r-stream", "t")
    msgs: list[MessageParam] = [{"role": "user", "content": "Explain."}]
    plain = anthropic.Anthropic(base_url=plain_s.anthropic_base_url, api_key=plain_s.api_key, max_retries=0)
    whole = plain.messages.create(model="p", max_tokens=300, system="You are a coding agent.", messages=msgs)
    streamed = anthropic.Anthropic(
        base_url=stream_s.anthropic_base_url, api_key=stream_s.api_key, max_retries=0
    )
    t0 = time.perf_counter()
    arrivals: list[float] = []
    pieces: list[str] = []
    kinds: list[str] = []
    for event in streamed.messages.create(
        model="p", max_tokens=300, system="You are a coding agent.", messages=msgs, stream=True
    ):
        kinds.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            arrivals.append(time.perf_counter() - t0)
            pieces.append(event.delta.text)
    end = time.perf_counter() - t0
    assert "".join(pieces) == _anthropic_text(whole) == LONG_REPLY
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-1] == "message_stop"
    assert arrivals[0] < 0.3 * end
    assert _same(*_calls(g.journal_dir)) == {}


def test_stream_text_goes_out_at_most_once_per_interval(gateway, fast_engine):
    """The default interval (1 s): a reply generated over ~2 s reaches the harness in a few text events at least
    a second apart (the stream opened with the first token), not one per token; together the same text as the
    non-streamed reply."""
    engine = fast_engine([{"text": LONG_REPLY}], per_token_s=0.03)
    g, admin = gateway(HTTPEngine(engine.base_url))
    assert g.config.stream_interval_ms == 1000
    plain_s, stream_s = admin.create_session("r-plain", "t"), admin.create_session("r-stream", "t")
    msgs: list[MessageParam] = [{"role": "user", "content": "Explain."}]
    plain = anthropic.Anthropic(base_url=plain_s.anthropic_base_url, api_key=plain_s.api_key, max_retries=0)
    whole = plain.messages.create(model="p", max_tokens=300, messages=msgs)
    streamed = anthropic.Anthropic(
        base_url=stream_s.anthropic_base_url, api_key=stream_s.api_key, max_retries=0
    )
    t0 = time.perf_counter()
    arrivals: list[float] = []
    pieces: list[str] = []
    for event in streamed.messages.create(model="p", max_tokens=300, messages=msgs, stream=True):
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            arrivals.append(time.perf_counter() - t0)
            pieces.append(event.delta.text)
    end = time.perf_counter() - t0
    assert "".join(pieces) == _anthropic_text(whole) == LONG_REPLY
    tokens = whole.usage.output_tokens
    assert tokens >= 50 and end > 1.5, (tokens, end)  # else the interval is not what is measured
    assert 2 <= len(pieces) <= end / 1.0 + 2, (len(pieces), end)  # one per second, and the last at the end
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:-1], strict=False)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # the end events may follow sooner than a full interval


def test_streamed_tool_call_text_first_then_calls_at_the_end(gateway, fast_engine):
    reply = 'I will list the files now.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    engine = fast_engine([{"text": reply}], per_token_s=0.005)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)
    chunks = list(client.chat.completions.create(model="p", messages=MSGS, stream=True))
    kinds = [
        "text" if c.choices[0].delta.content else "call" if c.choices[0].delta.tool_calls else "other"
        for c in chunks
        if c.choices
    ]
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "I will list the files now."
    )
    assert kinds.index("call") > max(i for i, k in enumerate(kinds) if k == "text")
    assert kinds.count("text") >= 2  # the text streamed before the tool call was parsed


def test_real_model_streamed_equals_non_streamed_for_the_same_seed(gateway):
    from harnessrl.engine.local import LocalEngine

    engine = LocalEngine(max_batch=4, threads=1)
    try:
        g, admin = gateway(engine)
        texts: list[str | None] = []
        msgs: Messages = [{"role": "user", "content": "Write a haiku about the sea."}]
        for i, stream in enumerate((False, True)):
            s = admin.create_session(f"r{i}", "t")
            client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0, timeout=120)
            if stream:
                chunks = client.chat.completions.create(
                    model="p", messages=msgs, max_tokens=16, temperature=0.9, seed=11, stream=True
                )
                texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            else:
                r = client.chat.completions.create(
                    model="p", messages=msgs, max_tokens=16, temperature=0.9, seed=11
                )
                texts.append(r.choices[0].message.content)
        plain_rec, stream_rec = _calls(g.journal_dir)
        assert texts[0] == texts[1] and texts[0]
        assert plain_rec.completion_ids == stream_rec.completion_ids
        assert plain_rec.completion_logprobs == pytest.approx(stream_rec.completion_logprobs, abs=1e-4)
    finally:
        engine.close()


def test_text_streamed_before_an_aborting_pause_stays_in_the_record(gateway, fast_engine):
    """The fast engine has no /abort: the pause cancels the stream; the tokens already shown to the harness
    are kept and the call continues from them after resume, so the stream and the record agree."""
    engine = fast_engine([{"text": LONG_REPLY}], per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url), stream_interval_ms=0)  # an event per token: paused at 3
    s = admin.create_session("r", "t")
    client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0, timeout=60)
    pieces: list[str] = []
    paused = False
    for chunk in client.chat.completions.create(model="p", messages=MSGS, max_tokens=300, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 3 and not paused:
                assert admin.pause("abort", timeout_s=30)["drained"]
                admin.resume()
                paused = True
    [rec] = _calls(g.journal_dir)
    assert paused and admin.metrics()["aborted_generations"] == 1
    shown = g.renderer.completion_text(rec.completion_ids)
    assert "".join(pieces) == shown and len(shown) > len(LONG_REPLY)  # partial stream + the continuation


def test_text_written_while_the_call_is_cancelled_is_not_sent_twice():
    """An aborting pause may cancel a streamed call while its text is being written: the write finishes
    (shielded), and the text sent after the resume continues from it instead of repeating it (the stream
    showed `about about` to a harness on a loaded machine)."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from harnessrl.gateway.enums import Api
    from harnessrl.gateway.streaming import SSEReply

    words = ["Let", " me", " think", " about", " this", " now."]

    async def handler(request: web.Request) -> web.StreamResponse:
        reply = SSEReply(request, Api.OPENAI, "p", lambda ids: "".join(words[i] for i in ids), [])
        reply.begin("c1", 3)
        await reply.on_tokens([0, 1, 2])
        streaming = asyncio.ensure_future(reply.on_tokens([0, 1, 2, 3]))
        await asyncio.sleep(0)  # the call is now awaiting its (shielded) write
        streaming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await streaming
        await reply.on_tokens([0, 1, 2, 3, 4, 5])  # after the resume
        return await reply.finish("Let me think about this now.", [], FinishReason.STOP, 6)

    async def go() -> str:
        app = web.Application()
        app.router.add_post("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}/") as r:
                body = (await r.read()).decode()
        finally:
            await runner.cleanup()
        chunks = [
            json.loads(line[5:])
            for line in body.splitlines()
            if line.startswith("data:") and "[DONE]" not in line
        ]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))

    assert asyncio.run(go()) == "Let me think about this now."
