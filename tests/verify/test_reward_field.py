"""The harness spec's `reward` field (RewardName) decides each rollout's reward in verify: two specs in one group,
the same agent, the same verdict, two rewards."""

from __future__ import annotations

import json

import pytest

from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.schema import RewardName
from harnessrl.taskset import TaskSet
from harnessrl.verify.grading import VerifyStatus, reward_for
from harnessrl.verify.rollouts import load_rollouts, run_verify
from tests.support.fixtures import requires_bwrap

COUNT_WORDS = "return len(text.split())"  # minicalc/text.py; test_count_words checks it


@pytest.mark.parametrize(
    ("status", "resolved", "fraction", "swebench", "f2p"),
    [
        (VerifyStatus.RESOLVED, True, 1.0, 1.0, 1.0),
        (VerifyStatus.UNRESOLVED, False, 0.5, 0.0, 0.5),
        (VerifyStatus.UNRESOLVED, False, None, 0.0, 0.0),
        (VerifyStatus.APPLY_FAILED, False, None, 0.0, 0.0),
        (VerifyStatus.TIMEOUT, False, 0.0, 0.0, 0.0),
        (VerifyStatus.INFRA_ERROR, False, 0.5, None, None),
    ],
)
def test_reward_for_each_verdict(status, resolved, fraction, swebench, f2p):
    assert reward_for(RewardName.SWEBENCH, status, resolved, fraction) == swebench
    assert reward_for(RewardName.F2P_FRACTION, status, resolved, fraction) == f2p


def one_line_bug(row: dict) -> tuple[str, str, str] | None:
    """(path, buggy line, fixed line) of a SWE-smith bug patch changing one line, or None."""
    lines = row["patch"].splitlines()
    minus = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    path = next(line[len("+++ b/") :] for line in lines if line.startswith("+++ b/"))
    return path, plus[0].strip(), minus[0].strip()


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@requires_bwrap
def test_two_specs_in_one_group_give_different_rewards_for_the_same_result(
    synth_taskset, fast_engine, tokenizer, tmp_path
):
    """The agent fixes the bug (every FAIL_TO_PASS test passes) but breaks count_words (a PASS_TO_PASS test
    fails): unresolved under SWE-bench rules, f2p_fraction 1. Before, verify ignored the spec: both 0."""
    row, (path, buggy, fixed) = next(
        (r, f)
        for r in TaskSet.open(synth_taskset).rows()
        if (f := one_line_bug(r)) is not None
        and COUNT_WORDS not in r["patch"]
        and any(t.endswith("::test_count_words") for t in r["PASS_TO_PASS"])
    )
    replies = [
        {
            "text": tool_call(
                "str_replace_editor", command="str_replace", path=path, old_str=buggy, new_str=fixed
            )
        },
        {
            "text": tool_call(
                "str_replace_editor",
                command="str_replace",
                path="minicalc/text.py",
                old_str=COUNT_WORDS,
                new_str=COUNT_WORDS + " + 1",
            )
        },
        {"text": tool_call("submit")},
    ]
    engine = fast_engine(replies)
    specs = parse_specs(
        [
            {"name": "binary", "reward": "swebench", "limits": {"turns": 5}},
            {"name": "shaped", "reward": "f2p_fraction", "limits": {"turns": 5}},
        ]
    )
    out = tmp_path / "gen"
    run_generate(
        synth_taskset,
        out,
        specs,
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=2, concurrency=2, instance_ids=[row["instance_id"]]),
    )
    rollouts = list(read_jsonl(out / "rollouts.jsonl"))
    assert [(r["group_id"], r["spec_name"], r["reward_fn"]) for r in rollouts] == [
        (row["instance_id"], "binary", "swebench"),
        (row["instance_id"], "shaped", "f2p_fraction"),
    ]
    assert rollouts[0]["model_patch"] == rollouts[1]["model_patch"]
    run_verify(synth_taskset, out, tmp_path / "verified", workers=2)
    rewards = {r["rollout_id"]: r for r in read_jsonl(tmp_path / "verified" / "rewards.jsonl")}
    binary, shaped = (rewards[r["rollout_id"]] for r in rollouts)
    for r in (binary, shaped):
        assert r["verify_status"] == "unresolved" and r["f2p_fraction"] == 1.0 and r["status"] == "ok"
    assert (binary["reward"], binary["reward_fn"]) == (0.0, "swebench")
    assert (shaped["reward"], shaped["reward_fn"]) == (1.0, "f2p_fraction")


def test_an_unknown_reward_in_a_rollout_row_is_one_error_naming_the_row(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(
        path, [{"rollout_id": "a__r0", "instance_id": "a", "model_patch": "", "reward_fn": "accuracy"}]
    )
    with pytest.raises(
        ValueError, match=r"row 1 \(a__r0\): reward_fn: unknown reward 'accuracy'; one of swebench"
    ):
        load_rollouts(path)
