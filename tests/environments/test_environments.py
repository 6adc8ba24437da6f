"""The environment interface as the stages use it: task sets of an environment, its default spec, rewards
with their parts through the verify stage, custom rewards by import path, and every bad input as a one-line
error or an infra-error reward (never a 0 the agent earned)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.environments.base import Finished, Reward, RewardStatus
from harnessrl.environments.instruction.env import (
    FRACTION,
    STRICT,
    InstructionEnvironment,
    PromptSplit,
    instruction_task,
    write_instruction_taskset,
)
from harnessrl.environments.registry import (
    UnknownEnvironment,
    call_reward,
    environment_of,
    get_environment,
    resolve_reward,
)
from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rollout.episode import plan_row, spec_for
from harnessrl.rollout.specs import parse_specs
from harnessrl.schema import HarnessName
from harnessrl.verify.rollouts import run_verify

ROW = {
    "instance_id": "if-1",
    "environment": "instruction",
    "problem_statement": "Describe a river. Do not use any commas. Include the keywords 'lantern' and 'winter'.",
    "constraints": [
        {"kind": "no_commas", "args": {}},
        {"kind": "keywords_present", "args": {"keywords": ["lantern", "winter"]}},
    ],
}
GOLD = "The river glows under a lantern on a cold winter night and runs quiet to the sea."


def _finished(answer: str) -> Finished:
    return Finished(answer, "", {"rollout_id": "r"})


def test_instruction_rewards_are_the_share_of_constraints_met_with_parts(tmp_path):
    env = InstructionEnvironment()
    grading = None  # answer-graded: nothing is executed
    gold = env.reward(ROW, _finished(GOLD), FRACTION, grading)  # type: ignore[arg-type]
    assert gold.total == 1.0 and gold.parts == {"no_commas#0": 1.0, "keywords_present#1": 1.0, "on_task": 1.0}
    half = env.reward(ROW, _finished("A lantern, a winter, a river."), FRACTION, grading)  # type: ignore[arg-type]
    assert half.total == 0.5 and half.detail == "1 of 2 constraints met"
    assert env.reward(ROW, _finished("A lantern, a winter."), STRICT, grading).total == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [
        "",  # empty: no word, every constraint fails (the negative ones included)
        "!!! ??? ...",  # symbols only: no commas, but no word either
        "concatenated lanterns wintery",  # substrings of the keywords are not the words
        "lantern winter " * 0 + "\u200blantern\u200b, winter",  # a comma hidden between zero-width spaces
    ],
    ids=["empty", "symbols", "substrings", "hidden-comma"],
)
def test_adversarial_answers_do_not_score(answer: str):
    reward = InstructionEnvironment().reward(ROW, _finished(answer), STRICT, None)  # type: ignore[arg-type]
    assert reward.total == 0.0, reward


# a task of the demo's family (prompts.WholeReply): one sentence, no commas, >= 12 words, a word of the request
CITY = {
    "instance_id": "if-city",
    "environment": "instruction",
    "problem_statement": (
        "Describe a city you would like to visit and why. Reply in one sentence. In your entire response, refrain "
        'from the use of any commas. Answer with at least 12 words. Include the keywords "city" in your response.'
    ),
    "constraints": [
        {"kind": "no_commas", "args": {}},
        {"kind": "word_count", "args": {"relation": "at least", "num_words": 12}},
        {"kind": "keywords_present", "args": {"keywords": ["city"]}},
    ],
}
CITY_ANSWER = "I would love to visit Kyoto because the old city keeps its temples and quiet gardens alive."


@pytest.mark.parametrize(
    ("answer", "finish_reason", "why"),
    [
        pytest.param(
            "1. Berlin (Germany)\n2. Tokyo (Japan)", "submitted", "fewer than 5 words", id="two-item-list"
        ),
        pytest.param("City", "submitted", "fewer than 5 words", id="one-word"),
        pytest.param(CITY["problem_statement"], "submitted", "echoes the request", id="request-echoed"),
        pytest.param(
            "Describe a city you would like to visit and why in one sentence with no commas at all please",
            "submitted",
            "echoes the request",
            id="request-reworded-little",
        ),
        pytest.param("city " * 14, "submitted", "repeats itself", id="filler-word"),
        pytest.param("the city is nice " * 4, "submitted", "repeats itself", id="filler-phrase"),
        pytest.param(CITY_ANSWER, "token_budget", "cut off by the reply budget", id="cut-off-by-the-budget"),
    ],
)
def test_replies_that_do_not_answer_the_request_earn_nothing(answer: str, finish_reason: str, why: str):
    """The on-task guard (environments/instruction/guard.py): form without an answer scores 0 under every
    instruction reward, whatever share of the constraints it meets."""
    env = InstructionEnvironment()
    finished = Finished(answer, "", {"rollout_id": "r", "finish_reason": finish_reason})
    for name in (FRACTION, STRICT):
        reward = env.reward(CITY, finished, name, None)  # type: ignore[arg-type]
        assert reward.total == 0.0 and reward.parts["on_task"] == 0.0, reward
        assert reward.detail.startswith(f"off task: {why}"), reward.detail


def test_a_whole_answer_to_the_request_is_scored():
    finished = Finished(CITY_ANSWER, "", {"rollout_id": "r", "finish_reason": "submitted"})
    reward = InstructionEnvironment().reward(CITY, finished, STRICT, None)  # type: ignore[arg-type]
    assert reward.total == 1.0 and reward.parts["on_task"] == 1.0, reward


def test_the_default_spec_is_the_chat_harness_and_react_must_be_able_to_answer():
    [react, answering] = parse_specs(
        [{"harness": "react"}, {"harness": "react", "tools": ["bash", "answer"]}]
    )
    spec = spec_for(ROW, [], 0, 0, 1)
    assert spec.spec.harness is HarnessName.CHAT
    row = plan_row(ROW, spec, 0)
    assert (row.environment, row.reward_fn, row.repo) == ("instruction", FRACTION, "")
    with pytest.raises(ValueError, match=r"task 'if-1' \(instruction\).*its `answer` tool: add 'answer'"):
        plan_row(ROW, react, 0)
    assert plan_row(ROW, answering, 0).harness is HarnessName.REACT  # in a scratch workspace


def test_a_reward_the_environment_does_not_offer_is_refused_by_task():
    env = InstructionEnvironment()
    assert resolve_reward(env, "", ROW) == FRACTION
    with pytest.raises(ValueError, match=r"task 'if-1' \(instruction\): reward 'swebench' is not one of"):
        resolve_reward(env, "swebench", ROW)
    with pytest.raises(ValueError, match="unknown reward 'fraction'"):
        parse_specs([{"harness": "chat", "reward": "fraction"}])


def test_unknown_and_custom_environments_by_name():
    with pytest.raises(UnknownEnvironment, match="unknown environment 'chess'; built-in: swe, instruction"):
        get_environment("chess")
    with pytest.raises(ImportError, match="environment 'no.such.module:Env' cannot be imported"):
        get_environment("no.such.module:Env")
    env = get_environment("harnessrl.environments.instruction.env:InstructionEnvironment")
    assert env.name == "instruction" and environment_of({"environment": "swe"}).name == "swe"
    with pytest.raises(UnknownEnvironment, match="is a dict, not an Environment"):
        get_environment("tests.environments.test_environments:ROW")


@pytest.mark.parametrize(
    ("function", "status", "detail"),
    [
        ("answer_length", RewardStatus.SCORED, ""),
        ("with_parts", RewardStatus.SCORED, "always half"),
        (
            "raises",
            RewardStatus.INFRA_ERROR,
            "task if-1: reward function tests.environments.custom_rewards:raises failed: RuntimeError: the grader's database is down",
        ),
        (
            "not_a_number",
            RewardStatus.INFRA_ERROR,
            "task if-1: reward function tests.environments.custom_rewards:not_a_number returned 'great', not a finite number or a Reward",
        ),
        ("nan", RewardStatus.INFRA_ERROR, "returned nan"),
        ("missing", RewardStatus.INFRA_ERROR, "cannot be imported: AttributeError"),
    ],
)
def test_custom_reward_functions(function: str, status: RewardStatus, detail: str):
    reward = call_reward(f"tests.environments.custom_rewards:{function}", ROW, _finished(GOLD))
    assert reward.status is status and detail in reward.detail
    if status is RewardStatus.SCORED:
        assert reward.total in (1.0, 0.5)
    else:
        assert reward.total is None


def test_a_scored_reward_must_be_a_finite_number():
    with pytest.raises(ValueError, match="a scored reward needs a finite number"):
        Reward(float("inf"))


def test_verify_grades_an_instruction_task_set_with_parts_and_infra_errors(tmp_path: Path):
    tasks = write_instruction_taskset(
        tmp_path / "tasks", 3, seed=0, split=PromptSplit.TRAIN, kinds=("no_commas",)
    )
    rows = list(read_jsonl(tasks.tasks_path))
    assert [r["environment"] for r in rows] == ["instruction"] * 3
    assert all(instruction_task(r).constraints[0].kind == "no_commas" for r in rows)
    rollouts = [
        {
            "rollout_id": "a",
            "instance_id": rows[0]["instance_id"],
            "final_answer": "A calm answer with no commas.",
        },
        {"rollout_id": "b", "instance_id": rows[1]["instance_id"], "final_answer": "One, two, three."},
        {
            "rollout_id": "c",
            "instance_id": rows[2]["instance_id"],
            "final_answer": "A reply that ran out of time",
            "rollout_status": "timeout",
        },
        {
            "rollout_id": "d",
            "instance_id": rows[0]["instance_id"],
            "final_answer": "anything",
            "reward_fn": "tests.environments.custom_rewards:raises",
        },
    ]
    write_jsonl(tmp_path / "rollouts.jsonl", rollouts)
    summary = run_verify(tasks.root, tmp_path / "rollouts.jsonl", tmp_path / "verified")
    got = {r["rollout_id"]: r for r in read_jsonl(tmp_path / "verified" / "rewards.jsonl")}
    assert (got["a"]["reward"], got["a"]["status"], got["a"]["reward_parts"]) == (
        1.0,
        "ok",
        {"no_commas#0": 1.0, "on_task": 1.0},
    )
    assert (got["b"]["reward"], got["b"]["verify_status"]) == (0.0, "unresolved")
    # graded, as a swe rollout is, but its status stays the rollout's: the trainer's `nonok` decides, never a
    # reward trained as if the agent had finished
    assert got["c"]["reward"] == 1.0 and got["c"]["status"] == "timeout"
    assert got["d"]["reward"] is None and got["d"]["status"] == "infra_error"
    assert "reward function tests.environments.custom_rewards:raises failed" in got["d"]["detail"]
    assert summary["graded"] == 3 and summary["resolved"] == 2
    instruction = summary["environments"]["instruction"]
    assert (instruction["rollouts"], instruction["graded"], instruction["infra_errors"]) == (4, 3, 1)
    assert instruction["part_means"] == {"no_commas#0": pytest.approx(2 / 3), "on_task": pytest.approx(2 / 3)}
    report = (tmp_path / "verified" / "report.md").read_text()
    assert "## By environment" in report and "| `instruction` |" in report


def test_the_task_set_cli_writes_disjoint_train_and_test_requests(tmp_path: Path):
    from harnessrl.cli import main

    for split in ("train", "test"):
        assert (
            main(["tasks", "instruction", "--out", str(tmp_path / split), "--n", "30", "--split", split]) == 0
        )
    prompts = {
        split: {
            json.loads(line)["problem_statement"].split(".")[0]
            for line in (tmp_path / split / "tasks.jsonl").open()
        }
        for split in ("train", "test")
    }
    assert prompts["train"] and prompts["test"] and not prompts["train"] & prompts["test"]


def test_the_rl_loop_trains_on_the_environments_asked_for(tmp_path: Path):
    from harnessrl.rl.workloads import TaskSetWorkload
    from harnessrl.taskset import write_taskset

    swe = {"instance_id": "pkg__x.1", "repo": "pkg/x", "problem_statement": "fix it"}
    mixed = write_taskset(tmp_path / "mixed", [ROW, swe], {}, "test").root
    assert TaskSetWorkload(mixed).task_ids() == ["if-1", "pkg__x.1"]
    assert TaskSetWorkload(mixed, environments=("instruction",)).task_ids() == ["if-1"]
    with pytest.raises(
        ValueError, match=r"no tasks of environment\(s\) kernel \(it holds: instruction, swe\)"
    ):
        TaskSetWorkload(mixed, environments=("kernel",))


def test_rl_flags_choose_the_estimator_and_the_environments():
    import argparse

    from components.rl_loop.cli import build_config, register

    parser = argparse.ArgumentParser()
    register(None, parser.add_subparsers())
    args = parser.parse_args(
        ["rl", "--tasks", "t", "--out", "o", "--estimator", "rloo", "--env", "instruction"]
    )
    cfg = build_config(args)
    assert cfg.estimator == "rloo" and cfg.environments == ("instruction",)
