"""The OpenAI Responses API (`/v1/responses`, what Codex speaks), answered as OpenAI answers it and recorded with
the same token fidelity as chat completions: the SSE event sequence (checked by the real OpenAI SDK's stream
accumulator and by hand), tool calls as `function_call` / `custom_tool_call` items, results matched by
`call_id`, `instructions`, reasoning and hosted-tool items, tools declared in `input` (Codex's code mode),
`previous_response_id`, a full context and a reply cut at the token limit, unknown routes. Real loopback HTTP,
the real OpenAI SDK and tokenizer, the fast engine server (scripted replies). The real Codex CLI runs against
the same routes in tests/harness/test_codex.py."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.client import SessionInfo
from harnessrl.gateway.messages import RequestError, from_responses, responses_tools_to_openai
from harnessrl.gateway.samples import build_samples, call_rows
from tests.gateway.support import call_records, read_records, send

BASH: Any = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files",
    "format": {"type": "text"},
}
CALL = {"cmd": "sed -n 1,20p calc.py"}
CALL_REPLY = (
    "Let me look.\n<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": CALL}) + "\n</tool_call>"
)
TWO_CALLS = "\n".join(
    "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": c}}) + "\n</tool_call>"
    for c in ("ls", "pwd")
)
START: list[Any] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You code."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix calc.py"}]},
]


def _client(s: SessionInfo) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)


def _sse(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _post(s: SessionInfo, body: dict) -> Any:
    return send(f"{s.openai_base_url}/responses", json.dumps(body).encode(), s.api_key)


def test_a_response_with_a_function_call_and_its_round_trip(gateway, fast_engine, tokenizer):
    """Text and a tool call come back as a `message` and a `function_call` item; the harness sends them back
    with the call's output (matched by call_id): the chain extends, and the sample holds exactly the sampled
    tokens at mask 1."""
    engine = fast_engine([{"text": CALL_REPLY}, {"text": "Fixed."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    first = _client(s).responses.create(model="gpt-5", input=START, tools=[BASH])
    assert first.status == "completed" and first.id.startswith("resp_")
    assert [o.type for o in first.output] == ["message", "function_call"]
    assert first.output_text == "Let me look."
    call = first.output[1]
    assert call.type == "function_call" and call.name == "exec_command" and json.loads(call.arguments) == CALL
    assert first.usage is not None and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    echoed: list[Any] = [o.model_dump(exclude_none=True) for o in first.output]  # as Codex echoes them
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "def add(a, b): ..."}
    second = _client(s).responses.create(model="gpt-5", input=[*START, *echoed, result], tools=[BASH])
    assert second.output_text == "Fixed."
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "extend"] and recs[1].discarded_trainable == 0
    assert all(r.api == "responses" for r in recs)
    assert "<tool_response>\ndef add(a, b): ...\n</tool_response>" in tokenizer.decode(recs[1].delta_ids)
    [sample] = build_samples(read_records(g.journal_dir))
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == recs[0].completion_ids + recs[1].completion_ids


def test_the_stream_is_the_responses_event_sequence(gateway, fast_engine):
    """The SDK's own stream accumulator rebuilds the same Response from the events; by hand: created,
    in_progress, the message item (content part, text deltas, done events), the function_call item with its
    arguments delta, completed; sequence numbers count up from 0 (before: the head, made with the first text,
    was numbered after it); no `[DONE]`."""
    engine = fast_engine([{"text": CALL_REPLY}], per_token_s=0.002)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    with _client(s).responses.stream(model="gpt-5", input=START, tools=[BASH]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [o.type for o in final.output] == [
        "message",
        "function_call",
    ] and final.output_text == "Let me look."
    assert kinds.count("response.output_text.delta") >= 2  # text arrives while the engine generates
    reply = _post(s, {"model": "gpt-5", "input": START, "tools": [BASH], "stream": True})
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    assert b"[DONE]" not in reply.body
    events = _sse(reply.body)
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events if name != "response.output_text.delta"]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, done = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and done["status"] == "completed"
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert text == "Let me look." == done["output"][0]["content"][0]["text"]
    args = next(data for name, data in events if name == "response.function_call_arguments.delta")["delta"]
    assert json.loads(args) == CALL and done["output"][1]["arguments"] == args
    assert done["usage"]["output_tokens"] > 0
    recs = call_records(g.journal_dir)
    assert recs[0].completion_ids == recs[1].completion_ids  # streamed or not, the same record


def test_parallel_call_outputs_are_matched_to_their_calls_by_id(gateway, fast_engine, tokenizer):
    """Outputs sent back in another order than the calls (parallel tools finish in any order) are rendered in
    the calls' order, so the chain extends instead of starting over."""
    engine = fast_engine([{"text": TWO_CALLS}, {"text": "Done."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    first = _client(s).responses.create(model="m", input=START, tools=[BASH])
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 2 and not any(o.type == "message" for o in first.output)
    outputs: list[Any] = [
        {"type": "function_call_output", "call_id": calls[1].call_id, "output": "/workspace"},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "calc.py"},
    ]
    echoed: list[Any] = [o.model_dump(exclude_none=True) for o in first.output]
    _client(s).responses.create(model="m", input=[*START, *echoed, *outputs], tools=[BASH])
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "extend"]
    delta = tokenizer.decode(recs[1].delta_ids)
    assert delta.index("calc.py") < delta.index("/workspace")


def test_input_items_become_the_policys_messages():
    """instructions first; developer/system as system; an assistant message and the calls after it are one
    turn (reasoning between them skipped); custom tool calls carry their raw input; images become a
    placeholder; an unknown item type is a 400 naming it."""
    items: list[Any] = [
        {"role": "user", "content": "Fix it"},  # an EasyInputMessage (no type)
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]},
        {"type": "reasoning", "id": "rs_2", "summary": []},
        {"type": "function_call", "call_id": "a", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "custom_tool_call", "call_id": "b", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "b", "output": "patched"},
        {
            "type": "function_call_output",
            "call_id": "a",
            "output": [
                {"type": "input_text", "text": "x.png"},
                {"type": "input_image", "image_url": "data:"},
            ],
        },
        {"type": "message", "role": "developer", "content": "Be brief."},
    ]
    msgs = from_responses("You code.", items)
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "You code."),
        ("user", "Fix it"),
        ("assistant", "On it."),
        ("tool", "x.png[input_image omitted: this model reads text only]"),
        ("tool", "patched"),
        ("system", "Be brief."),
    ]
    assert [(c.name, c.arguments) for c in msgs[2].tool_calls] == [
        ("exec_command", {"cmd": "ls"}),
        ("apply_patch", {"input": "*** Begin Patch"}),
    ]
    assert [m.name for m in msgs[3:5]] == ["exec_command", "apply_patch"]
    with pytest.raises(RequestError, match=r"input\[0\]\.type: unsupported input item type 'bogus'"):
        from_responses(None, [{"type": "bogus"}])


def test_tools_a_policy_can_call_and_the_ones_it_cannot():
    tools, kinds = responses_tools_to_openai(
        [
            BASH,
            PATCH_TOOL,
            {"type": "web_search", "external_web_access": True},  # hosted by the provider: not offered
            {"type": "namespace", "name": "functions", "tools": [{**BASH, "name": "wait"}]},
        ]
    )
    assert [t["function"]["name"] for t in tools] == ["exec_command", "apply_patch", "wait"]
    assert kinds == {
        "exec_command": "function_call",
        "apply_patch": "custom_tool_call",
        "wait": "function_call",
    }
    assert tools[1]["function"]["parameters"]["required"] == ["input"]


def test_custom_tools_and_tools_declared_in_input(gateway, fast_engine, tokenizer):
    """Codex's code mode declares its tools in an `additional_tools` input item (with `tools` empty); a call of
    a custom tool comes back as a `custom_tool_call` item with the raw input. Before: a 400 (`input[0].type:
    unsupported input item type 'additional_tools'`) that ended every rollout under Codex's default model."""
    patch_reply = "<tool_call>\n" + json.dumps({"name": "apply_patch", "arguments": {"input": "*** Begin"}})
    engine = fast_engine([{"text": patch_reply + "\n</tool_call>"}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    declared = {"type": "additional_tools", "role": "developer", "tools": [PATCH_TOOL]}
    reply = _post(s, {"model": "m", "input": [declared, *START], "tools": [], "stream": True})
    events = _sse(reply.body)
    done = events[-1][1]["response"]
    assert done["output"] == [
        {
            "id": done["output"][0]["id"],
            "status": "completed",
            "type": "custom_tool_call",
            "call_id": done["output"][0]["call_id"],
            "name": "apply_patch",
            "input": "*** Begin",
        }
    ]
    assert "response.custom_tool_call_input.delta" in [name for name, _ in events]
    [row] = call_rows(read_records(g.journal_dir))
    assert '"name": "apply_patch"' in tokenizer.decode(row["prompt_ids"])  # the policy was offered the tool


def test_previous_response_id_continues_a_stored_response(gateway, fast_engine):
    engine = fast_engine([{"text": CALL_REPLY}, {"text": "Fixed."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    first = client.responses.create(model="m", input=START, tools=[BASH], instructions="Be careful.")
    call = first.output[1]
    assert call.type == "function_call"
    result: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
    client.responses.create(
        model="m", previous_response_id=first.id, input=result, tools=[BASH], instructions="Be careful."
    )
    assert [r.op for r in call_records(g.journal_dir)] == ["new", "extend"]
    unstored = client.responses.create(model="m", input=START, tools=[BASH], store=False)
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model="m", previous_response_id=unstored.id, input=result, tools=[BASH])


def test_a_full_context_is_context_length_exceeded(gateway):
    """No room left: the Responses API's `context_length_exceeded` — a failed stream (what Codex reads as a
    full context window) or a 400; nothing sampled, a context_exhausted notice journaled."""
    g, admin = gateway(max_model_len=64)
    s = admin.create_session("r", "t")
    reply = _post(s, {"model": "m", "input": START, "tools": [BASH], "stream": True})
    assert reply.status == 200
    events = _sse(reply.body)
    assert [name for name, _ in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
    plain = _post(s, {"model": "m", "input": START, "tools": [BASH]})
    assert plain.status == 400 and plain.json()["error"]["code"] == "context_length_exceeded"
    assert call_records(g.journal_dir) == [] and admin.metrics()["context_exhausted"] == 2


def test_a_reply_cut_at_the_token_limit_is_incomplete(gateway, fast_engine):
    engine = fast_engine([{"text": "word " * 50}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    reply = _post(s, {"model": "m", "input": START, "max_output_tokens": 5, "stream": True})
    events = _sse(reply.body)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    plain = _client(s).responses.create(model="m", input=START, max_output_tokens=5)
    assert plain.status == "incomplete"


def test_bad_requests_and_unknown_routes_get_openai_shaped_errors(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    bad = _post(s, {"model": "m", "input": START, "max_output_tokens": 0})
    assert bad.status == 400 and "max_output_tokens" in bad.error()
    weird = _post(s, {"model": "m", "input": [{"type": "message", "role": "tool", "content": "x"}]})
    assert weird.status == 400 and "input[0].role" in weird.error()
    for path, method in (("/responses/resp_1", "GET"), ("/responses/compact", "POST"), ("/realtime", "POST")):
        reply = send(f"{s.openai_base_url}{path}", b"{}", s.api_key, method=method)
        assert reply.status in (404, 405) and reply.json()["error"]["message"], (path, reply.body)
    assert _post(s, {"model": "m", "input": START} | {"input": "hi"}).status == 200  # a string input
    unauthorized = send(f"{s.openai_base_url}/responses", json.dumps({"input": "hi"}).encode(), "wrong")
    assert unauthorized.status == 401 and unauthorized.error()
