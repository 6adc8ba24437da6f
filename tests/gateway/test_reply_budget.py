"""A session's reply budget (`limits.reply_tokens` of a harness spec): every call of the session samples at
most that many tokens whatever it asks, and the harness sees its own API's ordinary length stop — the way a
CLI agent that asks for tens of thousands of output tokens is held to a budget the tiny model can meet. Its
context window (`limits.context_tokens`): a call's prompt and reply fit in it, and a prompt that fills it gets
the API's context-full answer. Both travel with the session (journaled)."""

from __future__ import annotations

import json

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.journal import decode_line, encode_record
from harnessrl.gateway.records import SessionRecord
from harnessrl.rollout.specs import parse_specs
from tests.gateway.support import call_records
from tests.support.fast_engine import FINAL_REPLY

LONG_ASK = 4000


def test_openai_and_anthropic_calls_are_cut_at_the_sessions_budget(gateway, fast_engine):
    import anthropic
    import openai

    engine = fast_engine([{"text": FINAL_REPLY}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t", reply_tokens=3)
    assert admin.session(s.session_id)["reply_tokens"] == 3

    chat = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)
    reply = chat.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe the repo."}], max_tokens=LONG_ASK
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3

    claude = anthropic.Anthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0)
    message = claude.messages.create(
        model="m", max_tokens=LONG_ASK, messages=[{"role": "user", "content": "Describe it again."}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3

    response = chat.responses.create(model="m", input="Once more.", max_output_tokens=LONG_ASK)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [len(r.completion_ids) for r in call_records(g.journal_dir)] == [3, 3, 3]


def test_a_call_asking_less_than_the_budget_gets_what_it_asks_and_no_budget_means_no_cap(
    gateway, fast_engine
):
    import openai

    engine = fast_engine([{"text": FINAL_REPLY}])
    _, admin = gateway(HTTPEngine(engine.base_url))
    for budget, ask, got in ((8, 2, 2), (None, 5, 5)):
        s = admin.create_session("r", "t", reply_tokens=budget)
        chat = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)
        reply = chat.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Describe."}], max_tokens=ask
        )
        assert reply.usage is not None and reply.usage.completion_tokens == got


def test_a_bad_budget_is_refused_naming_the_field(gateway, fast_engine):
    _, admin = gateway(HTTPEngine(fast_engine([{"text": FINAL_REPLY}]).base_url))
    for key in ("reply_tokens", "context_tokens"):
        response = httpx.post(
            f"{admin.base_url}/admin/sessions",
            json={"rollout_id": "r", "group_id": "t", key: 0},
            headers={"Authorization": f"Bearer {admin.token}"},
        )
        assert response.status_code == 400 and key in response.text


def test_a_sessions_context_window_cuts_the_reply_that_would_overflow_it_and_refuses_a_full_prompt(
    gateway, fast_engine
):
    """The window is the session's, below the engine's (the gateway's max_model_len is far larger here): a
    reply ends where prompt + reply reach it (`length`); a prompt that leaves no room gets each API's
    context-full answer — chat an empty reply cut for length, Anthropic the 400 Claude Code reads as a full
    context — and the engine is not asked."""
    import anthropic
    import openai

    engine = fast_engine([{"text": FINAL_REPLY}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    ask = "Describe the repo."

    def chat_call(context_tokens: int | None) -> ChatCompletion:
        s = admin.create_session("r", "t", context_tokens=context_tokens)
        chat = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": ask}]
        return chat.chat.completions.create(model="m", messages=messages, max_tokens=LONG_ASK)

    free = chat_call(None)
    assert free.usage is not None and free.choices[0].finish_reason == "stop"
    prompt, whole = free.usage.prompt_tokens, free.usage.completion_tokens
    assert whole > 2

    cut = chat_call(prompt + 2)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 2
    engine_calls = engine.requests
    full = chat_call(prompt)
    assert full.choices[0].finish_reason == "length" and full.choices[0].message.content in ("", None)
    assert engine.requests == engine_calls  # answered by the gateway

    s = admin.create_session("r", "t", context_tokens=prompt)
    assert admin.session(s.session_id)["context_tokens"] == prompt
    claude = anthropic.Anthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0)
    with pytest.raises(
        anthropic.BadRequestError, match=rf"prompt is too long: \d+ tokens > {prompt - 1} maximum"
    ):
        claude.messages.create(model="m", max_tokens=LONG_ASK, messages=[{"role": "user", "content": ask}])
    assert [len(r.completion_ids) for r in call_records(g.journal_dir)] == [whole, 2]


def test_the_budgets_are_journaled_and_journals_of_before_read_the_same():
    plain = SessionRecord("s-1", "r", "t", "00", 1.0)
    assert b"reply_tokens" not in encode_record(plain) and b"context_tokens" not in encode_record(plain)
    capped = SessionRecord("s-1", "r", "t", "00", 1.0, reply_tokens=64, context_tokens=512)
    assert decode_line(encode_record(capped)) == capped
    assert json.loads(encode_record(capped))["reply_tokens"] == 64
    assert json.loads(encode_record(capped))["context_tokens"] == 512


def test_specs_set_it_for_every_harness_and_refuse_a_bad_one():
    for harness in ("chat", "react", "mini-swe-agent", "claude-code", "codex"):
        [spec] = parse_specs([{"harness": harness, "limits": {"reply_tokens": 96}}])
        assert spec.spec.limits["reply_tokens"] == 96
    assert "reply_tokens" not in parse_specs([{}])[0].spec.limits
    for bad in (0, -1, 2.5, "64", True):
        for key in ("reply_tokens", "context_tokens"):
            with pytest.raises(ValueError, match=rf"\[0\]\.limits\.{key}: expected an integer >= 1"):
                parse_specs([{"harness": "claude-code", "limits": {key: bad}}])
