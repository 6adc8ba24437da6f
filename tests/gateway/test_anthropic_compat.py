"""What Claude Code sends, answered as Anthropic's API answers it (issue 23): system messages inside `messages`,
tool calls echoed back with their defaults filled in, images in tool results, tool results matched to their calls
by id, a full context, token counting, unknown routes, the SSE event sequence, compaction from before an executed
turn. Real loopback HTTP, the real Anthropic SDK and tokenizer, the fast engine server (scripted replies). The
same defects are exercised with the real CLI in tests/harness/test_claude_code.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, ToolParam
from jinja2 import TemplateError

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.client import SessionInfo
from harnessrl.gateway.messages import Msg, from_anthropic
from harnessrl.gateway.render import ChatRenderer
from harnessrl.gateway.samples import build_samples
from tests.gateway.support import call_records, read_records, send

EDIT_TOOL: ToolParam = {
    "name": "Edit",
    "description": "Replace text in a file",
    "input_schema": {
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["file_path", "old_string", "new_string"],
    },
}
SAMPLED_EDIT = {"file_path": "/workspace/calc.py", "old_string": "a - b", "new_string": "a + b"}
EDIT_REPLY = (
    "I will fix it.\n<tool_call>\n"
    + json.dumps({"name": "Edit", "arguments": SAMPLED_EDIT})
    + "\n</tool_call>"
)
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def _client(s: SessionInfo) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0)


def test_system_messages_inside_messages_are_rendered_where_they_stand(gateway, tokenizer):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    msgs: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
        {"role": "system", "content": "Available agent types: general-purpose."},  # what Claude Code sends
    ]
    reply = _client(s).messages.create(
        model="claude-opus-4-8", max_tokens=64, system="You code.", messages=msgs
    )
    assert reply.stop_reason in ("end_turn", "tool_use")
    [rec] = call_records(g.journal_dir)
    text = tokenizer.decode(rec.inherited_ids + rec.delta_ids)
    assert text.index("Fix the bug.") < text.index("<|im_start|>system\nAvailable agent types")


def test_a_template_that_allows_system_only_first_gets_it_as_a_user_turn(tokenizer):
    class FirstSystemOnly:  # what Llama / Qwen-style templates do with a later system message
        def __init__(self, tok: Any) -> None:
            self._tok = tok

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tok, name)

        def apply_chat_template(self, messages: list[dict], **kw: Any) -> Any:
            if any(m["role"] == "system" for m in messages[1:]):
                raise TemplateError("System message must be at the beginning.")
            return self._tok.apply_chat_template(messages, **kw)

    renderer = ChatRenderer(FirstSystemOnly(tokenizer))
    assert renderer.mid_system_role == "user" and ChatRenderer(tokenizer).mid_system_role == "system"
    ids = renderer.full_prompt([Msg("system", "S"), Msg("user", "U"), Msg("system", "later")], None)
    assert "<|im_start|>user\nlater<|im_end|>" in tokenizer.decode(ids)


def test_a_tool_call_echoed_with_its_defaults_extends_the_chain(gateway, fast_engine):
    engine = fast_engine([{"text": EDIT_REPLY}, {"text": "Done."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs: list[Any] = [{"role": "user", "content": "Fix calc.py"}]
    first = client.messages.create(model="p", max_tokens=200, messages=msgs, tools=[EDIT_TOOL])
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.input == SAMPLED_EDIT
    # Claude Code echoes the call back with the schema's default filled in (the model never sampled it)
    echoed: Any = [*[b.model_dump() for b in first.content if b.type == "text"]]
    echoed.append(
        {"type": "tool_use", "id": call.id, "name": "Edit", "input": {**SAMPLED_EDIT, "replace_all": False}}
    )
    msgs += [
        {"role": "assistant", "content": echoed},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "updated"}]},
    ]
    client.messages.create(model="p", max_tokens=200, messages=msgs, tools=[EDIT_TOOL])
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "extend"] and recs[1].discarded_trainable == 0
    # a value other than the default is another action: the harness rewrote the turn, which rolls it back
    other = admin.create_session("r2", "t")
    _client(other).messages.create(model="p", max_tokens=200, messages=msgs[:1], tools=[EDIT_TOOL])
    echoed[-1]["input"]["replace_all"] = True
    _client(other).messages.create(model="p", max_tokens=200, messages=msgs, tools=[EDIT_TOOL])
    assert [r.op for r in call_records(g.journal_dir)[2:]] == ["new", "rollback"]


def test_images_in_tool_results_become_a_placeholder(gateway, tokenizer):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    msgs: Any = [
        {"role": "user", "content": "Look at the plot."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "a.png"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [PNG]}, PNG]},
    ]
    _client(s).messages.create(model="p", max_tokens=32, messages=msgs)
    [rec] = call_records(g.journal_dir)
    text = tokenizer.decode(rec.inherited_ids + rec.delta_ids)
    assert text.count("[image (image/png) omitted: this model reads text only]") == 2


def test_tool_results_are_matched_to_their_calls_by_id():
    msgs = from_anthropic(
        None,
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "a", "name": "Read", "input": {}},
                    {"type": "tool_use", "id": "b", "name": "Bash", "input": {}},
                ],
            },
            {  # answered in the other order, with a note between
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "b", "content": "from Bash"},
                    {"type": "text", "text": "note"},
                    {"type": "tool_result", "tool_use_id": "a", "content": "from Read"},
                ],
            },
        ],
    )
    assert [(m.role, m.content, m.name) for m in msgs[2:]] == [
        ("tool", "from Read", "Read"),
        ("user", "note", None),
        ("tool", "from Bash", "Bash"),
    ]


def test_a_full_context_is_anthropics_prompt_too_long(gateway):
    g, admin = gateway(max_model_len=40)
    s = admin.create_session("r", "t")
    with pytest.raises(anthropic.BadRequestError) as err:
        _client(s).messages.create(
            model="p", max_tokens=64, messages=[{"role": "user", "content": "x " * 50}]
        )
    assert err.value.status_code == 400
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: ") and body["error"]["message"].endswith(
        " tokens > 39 maximum"
    )
    assert call_records(g.journal_dir) == [] and admin.metrics()["context_exhausted"] == 1
    _client(s).messages.create(
        model="p", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )  # usable


def test_count_tokens_is_the_rendered_prompt(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    msgs: list[MessageParam] = [{"role": "user", "content": "Fix calc.py"}]
    counted = _client(s).messages.count_tokens(
        model="p", system="You code.", messages=msgs, tools=[EDIT_TOOL]
    )
    _client(s).messages.create(model="p", max_tokens=16, system="You code.", messages=msgs, tools=[EDIT_TOOL])
    [rec] = call_records(g.journal_dir)
    assert counted.input_tokens == rec.timings.prompt_tokens > 0  # what the call's prompt was


def test_unknown_routes_get_the_providers_error_shape(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    batches = send(f"{s.anthropic_base_url}/v1/messages/batches", b"{}", s.api_key)
    assert batches.status == 404
    assert batches.json()["type"] == "error" and batches.json()["error"]["type"] == "not_found_error"
    probe = urllib.request.Request(
        f"{s.anthropic_base_url}/v1/files", headers={"anthropic-version": "2023-06-01"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(probe, timeout=30)
    assert json.loads(err.value.read())["error"]["type"] == "not_found_error"
    other = send(f"{s.openai_base_url}/embeddings", b"{}", s.api_key)  # OpenAI's routes keep their types
    assert other.status == 404 and other.json()["error"]["type"] == "not_found"


def test_a_closed_session_tells_sdks_not_to_retry(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    admin.end_session(s.session_id)
    reply = send(
        f"{s.anthropic_base_url}/v1/messages",
        json.dumps({"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}).encode(),
        s.api_key,
    )
    assert reply.status == 409 and reply.headers["x-should-retry"] == "false"


def _sse_events(body: bytes) -> list[tuple[str, dict]]:
    events = []
    for block in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_the_stream_is_anthropics_event_sequence(gateway, fast_engine, monkeypatch):
    from harnessrl.gateway import streaming

    monkeypatch.setattr(streaming, "PING_EVERY_S", 0.05)  # pings while the tool call is held back
    engine = fast_engine([{"text": EDIT_REPLY}], per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    body = {"model": "p", "max_tokens": 200, "stream": True, "tools": [EDIT_TOOL]}
    body["messages"] = [{"role": "user", "content": "Fix calc.py"}]
    reply = send(f"{s.anthropic_base_url}/v1/messages?beta=true", json.dumps(body).encode(), s.api_key)
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    events = _sse_events(reply.body)
    assert all(data["type"] == name for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names.count("ping") >= 3
    names = [name for name in names if name != "ping"]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] > 0 and start["stop_reason"] is None and start["content"] == []
    assert start["usage"]["cache_read_input_tokens"] == 0
    blocks = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [b["type"] for b in blocks] == ["text", "tool_use"] and blocks[1]["input"] == {}
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    text = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    args = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert text == "I will fix it." and json.loads(args) == SAMPLED_EDIT
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 0


def test_compaction_from_before_an_executed_turn_is_a_chain_of_its_own(gateway, fast_engine, tokenizer):
    engine = fast_engine([{"text": EDIT_REPLY}, {"text": "Summary: calc.py needs a + b."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    start: list[MessageParam] = [{"role": "user", "content": "Fix calc.py"}]
    first = client.messages.create(model="p", max_tokens=200, messages=start, tools=[EDIT_TOOL])
    [call] = [b for b in first.content if b.type == "tool_use"]
    # Claude Code's compaction: the history before the executed Edit turn, then "summarize"
    compact: list[MessageParam] = [*start, {"role": "user", "content": "CRITICAL: Respond with TEXT ONLY."}]
    client.messages.create(model="p", max_tokens=200, messages=compact, tools=[EDIT_TOOL])
    # the agent goes on after the executed turn
    on: Any = [
        *start,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "updated"}]},
    ]
    client.messages.create(model="p", max_tokens=200, messages=on, tools=[EDIT_TOOL])
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "fork", "extend"]
    assert sum(r.discarded_trainable for r in recs) == 0 and recs[2].chain_id == recs[0].chain_id
    samples = build_samples(read_records(g.journal_dir))
    main = next(x for x in samples if len(x.input_ids) == max(len(y.input_ids) for y in samples))
    trained = [t for t, m in zip(main.input_ids, main.loss_mask, strict=True) if m]
    assert trained[: len(recs[0].completion_ids)] == recs[0].completion_ids  # the executed Edit still trains
    assert len(samples) == 2


def test_a_reply_without_tool_calls_that_the_harness_drops_still_rolls_back(gateway, fast_engine):
    engine = fast_engine([{"text": "I think the answer is 4."}, {"text": "Done."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    start: list[MessageParam] = [{"role": "user", "content": "Fix calc.py"}]
    client.messages.create(model="p", max_tokens=200, messages=start, tools=[EDIT_TOOL])
    # mini-swe-agent's format error: the unusable reply is dropped and a reminder follows the prompt
    client.messages.create(
        model="p",
        max_tokens=200,
        messages=[*start, {"role": "user", "content": "Use a tool."}],
        tools=[EDIT_TOOL],
    )
    assert [r.op for r in call_records(g.journal_dir)] == ["new", "rollback"]
