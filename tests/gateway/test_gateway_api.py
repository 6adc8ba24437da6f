"""The gateway over real loopback HTTP with the real OpenAI / Anthropic SDKs, the real SmolLM2 tokenizer and
the fast engine server (real HTTP, trivial scripted model)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletion, ChatCompletionAssistantMessageParam

from components.sft.demos import ScriptedEngine
from harnessrl.engine.base import FinishReason, Generation
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.client import GatewayClientError, SessionInfo
from harnessrl.gateway.samples import build_samples
from tests.gateway.support import (
    BASH_TOOL,
    FINAL_REPLY,
    TOOL_REPLY,
    Messages,
    assistant_param,
    call_records,
    read_records,
)


def _client(s: SessionInfo, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0, **kw)


def _turn(client: openai.OpenAI, msgs: Messages) -> ChatCompletion:
    r = client.chat.completions.create(model="policy", messages=msgs, tools=[BASH_TOOL])
    msgs.append(assistant_param(r.choices[0].message))
    return r


def _call_id(r: ChatCompletion) -> str:
    calls = r.choices[0].message.tool_calls
    assert calls
    return calls[0].id


def _start() -> Messages:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files."},
    ]


def test_multi_turn_tool_use_is_one_chain_with_sampled_tokens(gateway, tokenizer):
    g, admin = gateway()
    s = admin.create_session("rollout-1", "task-1")
    client = _client(s)
    msgs = _start()
    r1 = _turn(client, msgs)
    assert r1.choices[0].finish_reason == "tool_calls"
    [call] = r1.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert (call.function.name, call.function.arguments) == ("bash", '{"command": "ls"}')
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"})
    r2 = _turn(client, msgs)
    assert r2.choices[0].message.content == FINAL_REPLY and r2.choices[0].finish_reason == "stop"

    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "extend"]
    assert recs[1].drift == "clean"
    [sample] = build_samples(read_records(g.journal_dir))
    assert (sample.rollout_id, sample.group_id, sample.rollout_status) == ("rollout-1", "task-1", "ok")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    expected = (
        tokenizer.encode(TOOL_REPLY, add_special_tokens=False)
        + [im_end]
        + tokenizer.encode(FINAL_REPLY, add_special_tokens=False)
        + [im_end]
    )
    assert trained == expected
    assert all(lp < 0 for lp, m in zip(sample.behavior_logprobs, sample.loss_mask, strict=True) if m)
    assert all(v == -1 for v, m in zip(sample.policy_version, sample.loss_mask, strict=True) if not m)
    # the sequence is exactly what a full render of the final conversation gives (ChatML is append-only here)
    assert sample.input_ids[: len(recs[1].delta_ids)] != []
    assert len(sample.input_ids) == len(sample.loss_mask) == len(sample.behavior_logprobs)


def test_streaming_sse_delivers_text_and_tool_calls(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    client = _client(s)
    chunks = list(
        client.chat.completions.create(
            model="policy",
            messages=_start(),
            tools=[BASH_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc.function for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == "I will list the files."
    assert calls[0] and calls[0].name == "bash" and calls[0].arguments == '{"command": "ls"}'
    assert finish == ["tool_calls"]
    usage = chunks[-1].usage
    assert usage and usage.completion_tokens > 0


def test_anthropic_messages_api_multi_turn_and_stream(gateway):
    g, admin = gateway()
    s = admin.create_session("r-anth", "t")
    client = anthropic.Anthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0)
    tools: list[ToolParam] = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    msgs: list[MessageParam] = [{"role": "user", "content": "List the files."}]
    r1 = client.messages.create(
        model="policy", max_tokens=200, system="You are a coding agent.", messages=msgs, tools=tools
    )
    assert r1.stop_reason == "tool_use"
    use = [b for b in r1.content if b.type == "tool_use"][0]
    assert use.name == "bash" and use.input == {"command": "ls"}
    msgs.append({"role": "assistant", "content": r1.content})
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]}
    )
    with client.messages.stream(
        model="policy", max_tokens=200, system="You are a coding agent.", messages=msgs, tools=tools
    ) as stream:
        final = stream.get_final_message()
    [block] = final.content
    assert block.type == "text" and block.text == FINAL_REPLY and final.stop_reason == "end_turn"
    ops = [r.op for r in call_records(g.journal_dir)]
    assert ops == ["new", "extend"]


def test_retry_rolls_back_and_rewrite_enters_as_context(gateway, tokenizer):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs = _start()
    _turn(client, msgs)
    first = msgs.pop()  # the harness discards the answer and retries the same prompt
    _turn(client, msgs)
    # then it rewrites the last assistant turn before continuing
    edited: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": "Edited by the harness."}
    msgs[-1] = edited
    msgs.append({"role": "user", "content": "go on"})
    _turn(client, msgs)
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "rollback", "rollback"]
    assert recs[1].discarded_trainable == len(recs[0].completion_ids) > 0
    assert recs[2].discarded_trainable == len(recs[1].completion_ids)
    assert first.get("content") == "I will list the files."
    [sample] = build_samples(read_records(g.journal_dir))
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == recs[2].completion_ids  # only the surviving turn trains
    context = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m])
    assert "Edited by the harness." in context
    assert (
        admin.metrics()["discarded_trainable_tokens"]
        == recs[1].discarded_trainable + recs[2].discarded_trainable
    )


def test_compaction_splits_into_a_new_chain(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs = _start()
    r = _turn(client, msgs)
    msgs.append({"role": "tool", "tool_call_id": _call_id(r), "content": "a.py"})
    _turn(client, msgs)
    compacted: Messages = [
        msgs[0],
        {"role": "user", "content": "Summary so far: listed files a.py. Continue."},
    ]
    _turn(client, compacted)
    recs = call_records(g.journal_dir)
    assert [r.op for r in recs] == ["new", "extend", "new"]
    assert recs[2].chain_id != recs[0].chain_id
    samples = build_samples(read_records(g.journal_dir))
    assert len(samples) == 2 and {x.rollout_id for x in samples} == {"r"}
    assert len(build_samples(read_records(g.journal_dir), selection="longest")) == 1


def test_interleaved_subagent_calls_get_separate_chains(gateway, fast_engine):
    engine = fast_engine(per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    main_msgs = _start()
    sub_msgs: Messages = [
        {"role": "system", "content": "You are a search sub-agent."},
        {"role": "user", "content": "Find x"},
    ]
    same_a, same_b = _start(), _start()  # two concurrent calls with one prefix (parallel resamples)
    threads = [
        threading.Thread(target=_turn, args=(client, m)) for m in (main_msgs, sub_msgs, same_a, same_b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the main agent continues its own chain after the sub-agents ran
    main_msgs.append({"role": "tool", "tool_call_id": "x", "content": "a.py"})
    _turn(client, main_msgs)
    recs = call_records(g.journal_dir)
    assert len(recs) == 5
    assert len({r.chain_id for r in recs[:4]}) == 4  # never two concurrent calls on one chain buffer
    assert recs[4].op == "extend"
    assert {r.op for r in recs[:4]} <= {"new", "fork"}
    assert len(build_samples(read_records(g.journal_dir))) == 4


def test_pause_drains_in_flight_and_answers_429(gateway, fast_engine):
    engine = fast_engine(per_token_s=0.03)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    done: dict[str, ChatCompletion] = {}
    t = threading.Thread(target=lambda: done.setdefault("r", _turn(client, _start())))
    t.start()
    time.sleep(0.3)
    res = admin.pause("finish", timeout_s=30)
    assert res["drained"] and res["in_flight"] == 0
    assert len(call_records(g.journal_dir)) == 1  # finished, journaled
    t.join(10)
    assert "r" in done
    req = urllib.request.Request(
        s.openai_base_url + "/chat/completions",
        method="POST",
        data=b'{"messages":[{"role":"user","content":"x"}]}',
        headers={"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 429 and e.value.headers["Retry-After"] == "2"
    admin.resume()
    assert _turn(client, _start()).choices[0].finish_reason == "tool_calls"


def test_pause_abort_resumes_the_call_after_resume(gateway, fast_engine):
    engine = fast_engine(per_token_s=0.05)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    out: dict[str, ChatCompletion] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _turn(client, _start())))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    res = admin.pause("abort", timeout_s=30)
    assert res["drained"] and time.monotonic() - t0 < 1.0  # did not wait for the generation
    assert "r" not in out  # the harness call is parked, not failed
    admin.resume()
    t.join(30)
    assert out["r"].choices[0].finish_reason == "tool_calls"
    assert admin.metrics()["aborted_generations"] == 1
    assert engine.requests == 2
    assert len(call_records(g.journal_dir)) == 1


class _AbortOnTheLastToken(ScriptedEngine):
    """Answers the first call as an engine does when a weight-sync abort lands in the step that sampled the
    reply's last token: the whole reply (ending in the stop token, or cut at the token budget), finish "abort".
    Later calls: "x" and a stop token, finish "stop"."""

    def __init__(self, tokenizer: Any, reply: str):
        super().__init__([], tokenizer, ".")
        self.reply = reply

    async def generate(self, prompt_ids, sampling, max_tokens, stop_token_ids=None, **_: Any) -> Generation:
        self.calls += 1
        text = self.reply if self.calls == 1 else "x"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), (stop_token_ids or [0])[0]]
        finish = FinishReason.ABORT if self.calls == 1 else FinishReason.STOP
        ids = ids[:max_tokens]
        return Generation(ids, [0.0] * len(ids), finish, 0, token_policy_versions=[0] * len(ids))


@pytest.mark.parametrize(("max_tokens", "finish"), [(64, "stop"), (3, "length")])
def test_an_abort_on_a_finished_reply_ends_it_as_it_ended(gateway, tokenizer, max_tokens, finish):
    """An abort that reaches a reply already complete (its stop token or its budget sampled) is not continued
    past its end: one engine call, the reply's own finish; only an unfinished reply is resumed."""
    engine = _AbortOnTheLastToken(tokenizer, "A reply of several tokens.")
    g, admin = gateway(engine)
    s = admin.create_session("r", "t")
    r = _client(s).chat.completions.create(model="policy", messages=_start(), max_tokens=max_tokens)
    assert engine.calls == 1, "the gateway generated past the end of a finished reply"
    assert r.choices[0].finish_reason == finish
    (rec,) = call_records(g.journal_dir)
    assert rec.finish_reason == finish and admin.metrics()["aborted_generations"] == 0
    if finish == "stop":
        assert r.choices[0].message.content == "A reply of several tokens."


def test_a_holding_pause_makes_new_calls_wait_instead_of_429(gateway, fast_engine):
    """What the RL loop's colocated mode uses: a call made during the optimizer step is slow, never refused,
    and it does not hold up the drain."""
    engine = fast_engine(per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)  # the OpenAI SDK with max_retries=0: a 429 would raise
    res = admin.pause("abort", timeout_s=30, hold_new=True)
    assert res["drained"]
    out: dict[str, ChatCompletion] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _turn(client, _start())))
    t.start()
    time.sleep(1.0)
    assert "r" not in out and engine.requests == 0  # waiting at the gateway, not at the engine
    assert admin.pause("finish", timeout_s=5, hold_new=True)["drained"]  # a held call is not at work
    admin.resume()
    t.join(30)
    assert out["r"].choices[0].finish_reason == "tool_calls"
    metrics = admin.metrics()
    assert metrics["held_paused"] == 1 and metrics["rejected_paused"] == 0
    assert len(call_records(g.journal_dir)) == 1


def test_context_budget_returns_length_instead_of_one_token(gateway, fast_engine):
    engine = fast_engine()
    g, admin = gateway(HTTPEngine(engine.base_url), max_model_len=40)
    s = admin.create_session("r", "t")
    r = _client(s).chat.completions.create(model="p", messages=_start() * 3, max_tokens=100)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == ""
    assert engine.requests == 0
    assert admin.metrics()["context_exhausted"] == 1


def test_auth_and_bad_requests_are_clear(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.openai_base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="p", messages=_start()
        )
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].role"):
        _client(s).chat.completions.create(
            model="p", messages=[], extra_body={"messages": [{"role": "robot", "content": "x"}]}
        )
    with pytest.raises(GatewayClientError, match="admin"):
        type(admin)(admin.base_url, "nope").metrics()
    admin.end_session(s.session_id)
    with pytest.raises(openai.ConflictError, match="ended"):
        _client(s).chat.completions.create(model="p", messages=_start())
    assert TOOL_REPLY  # the script the fast engine answers with


@pytest.mark.parametrize("any_depth", [False, True])
def test_deeper_rewind_forks_or_truncates(gateway, any_depth):
    g, admin = gateway(rollback_any_depth=any_depth)
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs = _start()
    r = _turn(client, msgs)
    msgs.append({"role": "tool", "tool_call_id": _call_id(r), "content": "a.py"})
    _turn(client, msgs)
    rewound: Messages = msgs[:2] + [
        {"role": "assistant", "content": "A different first answer."},
        {"role": "user", "content": "try again"},
    ]  # rewinds two assistant turns
    _turn(client, rewound)
    recs = call_records(g.journal_dir)
    if any_depth:
        assert recs[2].op == "rollback" and recs[2].chain_id == recs[0].chain_id
        assert recs[2].discarded_trainable == len(recs[0].completion_ids) + len(recs[1].completion_ids)
        assert len(build_samples(read_records(g.journal_dir))) == 1
    else:
        assert recs[2].op == "fork" and recs[2].parent_chain_id == recs[0].chain_id
        assert recs[2].discarded_trainable == 0
        assert len(build_samples(read_records(g.journal_dir))) == 2


def test_admin_cli_against_a_running_gateway(gateway, capsys):
    from harnessrl.cli import main as cli_main

    g, admin = gateway()
    assert (
        cli_main(
            [
                "gateway",
                "admin",
                "create-session",
                "--url",
                admin.base_url,
                "--admin-token",
                "admin-secret",
                "--rollout-id",
                "r9",
                "--group-id",
                "g9",
            ]
        )
        == 0
    )
    assert '"openai_base_url"' in capsys.readouterr().out
    assert cli_main(["gateway", "admin", "metrics", "--url", admin.base_url, "--admin-token", "wrong"]) == 2
    assert "HTTP 401" in capsys.readouterr().err
    assert cli_main(["gateway", "admin", "end-session", "--url", admin.base_url, "--admin-token", "x"]) == 2
    assert "needs --session-id" in capsys.readouterr().err


def test_stop_strings_cut_the_reply_and_the_trained_tokens(gateway, tokenizer):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs: Messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="p", messages=msgs, max_tokens=100)  # turn 0: the tool-call reply
    msgs.append({"role": "assistant", "content": "x"})
    r = client.chat.completions.create(
        model="p", messages=[*msgs, {"role": "user", "content": "and?"}], max_tokens=100, stop=["two files"]
    )
    assert r.choices[0].message.content == "The repository has " and r.choices[0].finish_reason == "stop"
    rec = call_records(g.journal_dir)[-1]
    text = tokenizer.decode(rec.completion_ids)
    assert "two files" in text and "a.py" not in text  # sampled up to the stop string, nothing after it
    with pytest.raises(openai.BadRequestError, match="stop"):
        client.chat.completions.create(model="p", messages=msgs, extra_body={"stop": [3]})
