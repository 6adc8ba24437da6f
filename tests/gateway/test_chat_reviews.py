"""The chat harness's review rounds (`options.reviews`): a self-checking agent whose every call starts a
context of its own, so one rollout yields several samples — as many as the model's own answers make it."""

from __future__ import annotations

import pytest

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.samples import build_samples
from harnessrl.harness.base import Endpoint, EpisodeEnd, TaskPrompt
from harnessrl.harness.chat import REVIEW, REWRITE, ChatConfig, ChatHarness
from tests.gateway.support import read_records

REQUEST = "Describe a river in one sentence with a [place] placeholder."


def run_rollout(gateway, fast_engine, replies: list[str], reviews: int):
    engine = fast_engine([{"text": t} for t in replies], select="order")
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r-1", "task-1")
    harness = ChatHarness(ChatConfig(reviews=reviews, max_tokens=32))
    result = harness.run(TaskPrompt("task-1", REQUEST), Endpoint(s.openai_base_url, s.api_key))
    return result, build_samples(read_records(g.journal_dir))


def test_a_no_leads_to_a_rewrite_and_a_yes_ends_the_rounds(gateway, fast_engine):
    result, samples = run_rollout(
        gateway, fast_engine, ["A draft.", "No.", "The rewrite at [place].", "Yes, it does."], reviews=3
    )
    assert result.final_answer == "The rewrite at [place]."
    assert result.turns == 4 and result.finish_reason is EpisodeEnd.SUBMITTED
    assert len(samples) == 4 and {s.rollout_id for s in samples} == {"r-1"}  # every call split off
    prompts = [m["content"] for m in result.transcript if m["role"] == "user"]
    assert prompts == [
        REQUEST,
        REVIEW.format(request=REQUEST, reply="A draft."),
        REWRITE.format(request=REQUEST, reply="A draft."),
        REVIEW.format(request=REQUEST, reply="The rewrite at [place]."),
    ]


def test_a_first_yes_keeps_the_first_reply_and_rounds_stop_at_the_limit(gateway, fast_engine):
    result, samples = run_rollout(gateway, fast_engine, ["First.", "yes"], reviews=2)
    assert result.final_answer == "First." and result.turns == 2 and len(samples) == 2

    result, samples = run_rollout(gateway, fast_engine, ["One.", "no", "Two.", "No!", "Three."], reviews=2)
    assert result.final_answer == "Three." and result.turns == 5 and len(samples) == 5


def test_reviews_off_is_one_call_and_bad_settings_are_refused():
    assert ChatConfig.from_spec({}, {}).reviews == 0
    with pytest.raises(ValueError, match="reviews >= 0"):
        ChatConfig.from_spec({}, {"reviews": -1})
