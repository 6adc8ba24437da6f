"""A harness spec's `train_chains`: which chains of a rollout become training samples. `all` (the default) keeps
every chain — the main agent, subagents, compaction, side calls; `main` keeps the chain the session's first
call started. The choice travels with the session (journaled), so the one place samples are assembled
(`gateway.samples.build_samples`: the generate stage's export and the RL loop's journal tail) applies it."""

from __future__ import annotations

import json

import pytest

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.enums import TrainChains
from harnessrl.gateway.journal import decode_line, encode_record
from harnessrl.gateway.records import SessionRecord
from harnessrl.gateway.samples import build_samples
from harnessrl.rollout.specs import parse_specs
from tests.gateway.support import BASH_TOOL, call_records, read_records
from tests.support.fast_engine import FINAL_REPLY, TOOL_REPLY


def _two_chains(session) -> None:
    """The agent's call, then a side call with another system prompt (a subagent): two chains."""
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Fix calc.py"}], tools=[BASH_TOOL]
    )
    client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "You are a subagent."}, {"role": "user", "content": "Look."}],
    )


@pytest.mark.parametrize(("choice", "kept"), [("all", 2), ("main", 1)])
def test_a_sessions_choice_decides_which_chains_become_samples(gateway, fast_engine, choice, kept):
    engine = fast_engine([{"text": TOOL_REPLY}, {"text": FINAL_REPLY}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t", train_chains=choice)
    _two_chains(s)
    assert admin.session(s.session_id)["train_chains"] == choice
    samples = build_samples(read_records(g.journal_dir))
    assert len(samples) == kept
    first = call_records(g.journal_dir)[0]
    assert any(x.sample_id.endswith(first.chain_id) for x in samples)  # the main chain: the first call's


def test_the_choice_is_journaled_and_journals_of_before_read_the_same():
    rec = SessionRecord("s-1", "r", "t", "00", 1.0)
    line = encode_record(rec)
    assert b"train_chains" not in line  # the default is not written: old journals re-encode byte for byte
    main = SessionRecord("s-1", "r", "t", "00", 1.0, TrainChains.MAIN)
    assert decode_line(encode_record(main)) == main
    assert json.loads(encode_record(main))["train_chains"] == "main"


def test_specs_choose_it():
    [spec] = parse_specs([{"harness": "codex", "train_chains": "main"}])
    assert spec.spec.train_chains == "main" and parse_specs([{}])[0].spec.train_chains == "all"
    with pytest.raises(ValueError, match=r"\[0\]\.train_chains"):
        parse_specs([{"train_chains": "some"}])
