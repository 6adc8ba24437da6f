"""A session's reply budget (`limits.reply_tokens` of a harness spec): every call of the session samples at
most that many tokens whatever it asks, and the harness sees its own API's ordinary length stop — the way a
CLI agent that asks for tens of thousands of output tokens is held to a budget the tiny model can meet. The
budget travels with the session (journaled)."""

from __future__ import annotations

import json

import httpx
import pytest

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
    response = httpx.post(
        f"{admin.base_url}/admin/sessions",
        json={"rollout_id": "r", "group_id": "t", "reply_tokens": 0},
        headers={"Authorization": f"Bearer {admin.token}"},
    )
    assert response.status_code == 400 and "reply_tokens" in response.text


def test_the_budget_is_journaled_and_journals_of_before_read_the_same():
    plain = SessionRecord("s-1", "r", "t", "00", 1.0)
    assert b"reply_tokens" not in encode_record(plain)
    capped = SessionRecord("s-1", "r", "t", "00", 1.0, reply_tokens=64)
    assert decode_line(encode_record(capped)) == capped
    assert json.loads(encode_record(capped))["reply_tokens"] == 64


def test_specs_set_it_for_every_harness_and_refuse_a_bad_one():
    for harness in ("chat", "react", "mini-swe-agent", "claude-code", "codex"):
        [spec] = parse_specs([{"harness": harness, "limits": {"reply_tokens": 96}}])
        assert spec.spec.limits["reply_tokens"] == 96
    assert "reply_tokens" not in parse_specs([{}])[0].spec.limits
    for bad in (0, -1, 2.5, "64", True):
        with pytest.raises(ValueError, match=r"\[0\]\.limits\.reply_tokens: expected an integer >= 1"):
            parse_specs([{"harness": "claude-code", "limits": {"reply_tokens": bad}}])
