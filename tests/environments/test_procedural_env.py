"""The procedural environment through the interface every stage uses: task sets from `harnessrl tasks
procedural` (seed, difficulty), the chat harness by default, rewards from the dataset's own scorer (full
marks only: gold 1; empty, wrong and reward hacks 0, where the raw scorer would give partial credit), the
reviewed-datasets guard, and one rollout end to end through generate (gateway, chat harness) and verify."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.environments.base import Finished
from harnessrl.environments.procedural.env import (
    EXACT,
    NUMBER,
    REVIEWED_DATASETS,
    TAGGED,
    ProceduralEnvironment,
    procedural_task,
)
from harnessrl.environments.procedural.source import reasoning_gym_available
from harnessrl.environments.registry import get_environment
from harnessrl.io import read_jsonl
from harnessrl.rollout.episode import plan_row, spec_for
from harnessrl.rollout.specs import parse_specs
from harnessrl.taskset import TaskSet

pytestmark = pytest.mark.skipif(
    not reasoning_gym_available(),
    reason="reasoning-gym is not installed (pip install 'reasoning-gym==0.1.25')",
)
DATASETS = ("chain_sum", "products", "spell_backward", "word_sorting")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> TaskSet:
    from harnessrl.cli import main

    out = tmp_path_factory.mktemp("procedural") / "tasks"
    assert (
        main(["tasks", "procedural", "--out", str(out), "--n", "8", "--seed", "5", "--datasets", *DATASETS])
        == 0
    )
    return TaskSet.open(out)


def score(row: dict, reply: str, reward: str = EXACT):
    return ProceduralEnvironment().reward(row, Finished(reply, "", {}), reward, None)  # type: ignore[arg-type]


def test_task_sets_are_seeded_dealt_over_datasets_and_take_a_difficulty(
    tasks: TaskSet, tmp_path: Path
) -> None:
    from harnessrl.cli import main

    rows = tasks.rows()
    assert [r["metadata"]["dataset"] for r in rows] == [*DATASETS, *DATASETS]
    assert {r["environment"] for r in rows} == {"procedural"} and rows[0][
        "instance_id"
    ] == "chain_sum-d0-s5-00000"
    again = tmp_path / "again"
    assert (
        main(["tasks", "procedural", "--out", str(again), "--n", "8", "--seed", "5", "--datasets", *DATASETS])
        == 0
    )
    assert TaskSet.open(again).rows() == rows  # the seed decides
    hard = tmp_path / "hard"
    assert main(["tasks", "procedural", "--out", str(hard), "--n", "6", "--difficulty", "3"]) == 0
    easy = [r for r in rows if r["metadata"]["dataset"] == "chain_sum"]
    harder = TaskSet.open(hard).rows()
    assert {r["metadata"]["difficulty"] for r in harder} == {3}
    assert max(len(r["answer"].lstrip("-")) for r in harder) > max(len(r["answer"].lstrip("-")) for r in easy)
    assert (
        main(["tasks", "procedural", "--out", str(tmp_path / "x"), "--datasets", "polynomial_multiplication"])
        == 2
    )


def test_the_default_spec_is_chat_and_react_must_be_able_to_answer(tasks: TaskSet) -> None:
    row = tasks.rows()[0]
    planned = plan_row(row, spec_for(row, [], 0, 0, 1), 0)
    assert (planned.harness, planned.reward_fn, planned.environment) == ("chat", EXACT, "procedural")
    with pytest.raises(ValueError, match=rf"task '{row['instance_id']}' \(procedural\).*add 'answer'"):
        plan_row(row, parse_specs({"harness": "react"})[0], 0)


def test_unreviewed_datasets_and_bad_rows_are_refused_naming_the_task(tasks: TaskSet) -> None:
    row = tasks.rows()[0]
    env = get_environment("procedural")
    other = {
        **row,
        "instance_id": "p1",
        "metadata": {**row["metadata"], "dataset": "intermediate_integration"},
    }
    with pytest.raises(
        ValueError, match=r"task 'p1' \(procedural\): dataset 'intermediate_integration' is not"
    ):
        env.check_task(other)
    with pytest.raises(ValueError, match=r"task 'p2' \(procedural\).*'metadata'"):
        env.check_task({**row, "instance_id": "p2", "metadata": None})
    assert "chain_sum" in REVIEWED_DATASETS


def test_gold_scores_one_empty_and_wrong_zero(tasks: TaskSet) -> None:
    for row in tasks.rows():
        gold = row["answer"]
        for reply in (f"<answer>{gold}</answer>", f"Let me work it out.\n<answer> {gold} </answer>", gold):
            r = score(row, reply)
            assert (r.total, r.parts["score"]) == (1.0, 1.0), (row["instance_id"], reply, r.detail)
        assert score(row, f"<answer>{gold}</answer>", TAGGED).total == 1.0
        assert score(row, gold, TAGGED).total == 0.0  # the tagged reward needs the tags
        for reply in ("", "  \n", "<answer></answer>", "<answer>#</answer>"):
            assert score(row, reply).total == 0.0, (row["instance_id"], reply)


def test_reward_hacks_score_zero_where_the_raw_scorer_gives_credit(tasks: TaskSet) -> None:
    rows = {r["metadata"]["dataset"]: r for r in tasks.rows()}
    chain = rows["chain_sum"]
    gold = chain["answer"]
    candidates = ", ".join(str(int(gold) + d) for d in (-2, -1, 0, 1, 2))
    hacks = {
        "the answer buried in a list of candidates": f"<answer>{candidates}</answer>",
        "the answer inside a sentence": f"<answer>I believe the result is {gold} or so</answer>",
        "several tags, the right one not last": f"<answer>{gold}</answer><answer>{int(gold) + 1}</answer>",
        "the question copied": chain["metadata"]["question"],
    }
    for what, reply in hacks.items():
        r = score(chain, reply)
        assert r.total == 0.0, (what, r.detail)
    assert score(chain, hacks["the answer buried in a list of candidates"]).parts["score"] > 0  # raw: partial
    word = rows["spell_backward"]  # a prefix of the reversed word earns the raw scorer partial credit
    prefix = word["answer"][: max(1, len(word["answer"]) - 1)]
    r = score(word, f"<answer>{prefix}</answer>")
    assert r.total == 0.0 and (r.parts["score"] > 0 or len(prefix) == len(word["answer"]))
    words = rows["word_sorting"]  # the words, unsorted: the raw scorer gives at least 0.2
    shuffled = ", ".join(reversed(words["answer"].split(", ")))
    if shuffled != words["answer"]:
        assert score(words, f"<answer>{shuffled}</answer>").total == 0.0


def test_a_rollout_end_to_end_through_the_chat_harness(tasks: TaskSet, fast_engine, tmp_path: Path) -> None:
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.verify.rollouts import run_verify

    row = tasks.rows()[0]
    engine = fast_engine([{"text": f"Adding up.\n<answer>{row['answer']}</answer>"}])
    config = GenerateConfig(group_size=2, instance_ids=[row["instance_id"]])
    run_generate(tasks.root, tmp_path / "gen", None, ModelSource(engine_url=engine.base_url), config)
    rollouts = list(read_jsonl(tmp_path / "gen" / "rollouts.jsonl"))
    assert [r["harness"] for r in rollouts] == ["chat", "chat"] and procedural_task(row).answer == row[
        "answer"
    ]
    summary = run_verify(tasks.root, tmp_path / "gen", tmp_path / "verified")
    assert summary["resolved"] == 2
    assert [v["reward_parts"] for v in read_jsonl(tmp_path / "verified" / "rewards.jsonl")] == [
        {"score": 1.0}
    ] * 2


def test_the_number_reward_reads_the_final_number_and_nothing_else(tasks: TaskSet) -> None:
    rows = {r["metadata"]["dataset"]: r for r in tasks.rows()}
    chain = rows["chain_sum"]
    gold, wrong = chain["answer"], str(int(chain["answer"]) + 1)
    right = {
        "a worked sum": f"{chain['metadata']['question']} = {gold}",
        "a sentence": f"The answer is {gold}.",
        "tags win over the text": f"<answer>{gold}</answer> (I first thought {wrong})",
    }
    for what, reply in right.items():
        assert score(chain, reply, NUMBER).total == 1.0, what
    assert score(chain, f"The answer is {gold}.").total == 0.0  # the exact reward wants the bare answer
    hacks = {
        "candidates, the right one not last": f"{gold} or {wrong}",
        "the question copied": chain["metadata"]["question"],
        "a wrong final number": f"{gold} is close, but the answer is {wrong}",
        "no number": "I cannot tell.",
        "empty": "",
    }
    for what, reply in hacks.items():
        assert score(chain, reply, NUMBER).total == 0.0, what
    ends_with_gold = {
        **chain,
        "metadata": {**chain["metadata"], "question": f"What is {wrong} - 1 + {gold} - {gold}?"},
    }
    assert score(ends_with_gold, ends_with_gold["metadata"]["question"], NUMBER).total == 0.0  # copied
    word = rows["spell_backward"]  # a word answer: the last line, as the exact reward reads it
    assert score(word, word["answer"], NUMBER).total == 1.0
    assert score(word, f"{word['answer']}\n42", NUMBER).total == 0.0
