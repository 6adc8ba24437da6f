"""Procedural tasks: answer extraction and the row format always; generation and reasoning-gym's own scoring
when reasoning-gym is installed (an optional dependency)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.environments.procedural.source import (
    ANSWER_INSTRUCTION,
    SHORT_DATASETS,
    ExtractMode,
    ProceduralTask,
    ReasoningGymMissing,
    extract_answer,
    generate_rows,
    load_rows,
    reasoning_gym_available,
    score_reply,
    write_rows,
)

needs_gym = pytest.mark.skipif(
    not reasoning_gym_available(),
    reason="reasoning-gym is not installed (optional: pip install reasoning-gym)",
)


@pytest.mark.parametrize(
    "reply, mode, expected",
    [
        pytest.param("I think\n<answer> 42 </answer>", ExtractMode.TAG, "42", id="tag"),
        pytest.param("<answer>1</answer> no, <answer>2</answer>\nbye", ExtractMode.TAG, "2", id="last-tag"),
        pytest.param("<ANSWER>\nabc\n</ANSWER>", ExtractMode.TAG, "abc", id="tag-case-multiline"),
        pytest.param("The answer is\n\n  17  \n\n", ExtractMode.TAG, None, id="no-tag"),
        pytest.param("The answer is\n\n  17  \n\n", ExtractMode.TAG_OR_LAST_LINE, "17", id="last-line"),
        pytest.param("<answer>5", ExtractMode.TAG_OR_LAST_LINE, "<answer>5", id="unclosed-tag-is-a-line"),
        pytest.param("  \n ", ExtractMode.TAG_OR_LAST_LINE, None, id="blank"),
    ],
)
def test_extract_answer(reply: str, mode: ExtractMode, expected: str | None) -> None:
    assert extract_answer(reply, mode) == expected


META: dict[str, object] = {
    "dataset": "chain_sum",
    "difficulty": 0,
    "seed": 1,
    "index": 0,
    "question": "1 + 2 =",
    "entry": {},
}


def _task(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "task_id": "chain_sum-d0-s1-00000",
        "prompt": f"1 + 2 =\n\n{ANSWER_INSTRUCTION}",
        "answer": "3",
        "metadata": META,
    }
    row.update(changes)
    return row


@pytest.mark.parametrize(
    "row, message",
    [
        pytest.param(
            _task(answer=3), r"\(task 'chain_sum-d0-s1-00000'\): field 'answer' must be a string", id="answer"
        ),
        pytest.param(
            {k: v for k, v in _task().items() if k != "metadata"}, "missing field 'metadata'", id="missing"
        ),
        pytest.param(_task(extra=1), "unknown field 'extra'", id="extra"),
        pytest.param(
            _task(metadata={"dataset": "x"}), r"field 'metadata.difficulty' is missing", id="meta-missing"
        ),
        pytest.param(
            _task(metadata={**META, "difficulty": -1}),
            r"field 'metadata.difficulty' must be an integer >= 0",
            id="difficulty",
        ),
    ],
)
def test_bad_rows_name_the_task_and_field(tmp_path: Path, row: dict[str, object], message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_rows(path)
    assert f"{path}:1" in str(e.value)


@pytest.mark.skipif(reasoning_gym_available(), reason="reasoning-gym is installed")
def test_generating_without_reasoning_gym_says_how_to_install_it() -> None:
    with pytest.raises(ReasoningGymMissing, match="pip install 'reasoning-gym=="):
        generate_rows("chain_sum", 1, seed=0)


@needs_gym
@pytest.mark.parametrize("difficulty", [0, 1])
@pytest.mark.parametrize("dataset", SHORT_DATASETS)
def test_gold_answers_score_one_wrong_and_empty_zero(tmp_path: Path, dataset: str, difficulty: int) -> None:
    tasks = generate_rows(dataset, 4, seed=3, difficulty=difficulty)
    path = tmp_path / "rows.jsonl"
    write_rows(path, tasks)
    reloaded = load_rows(path)  # scoring works from the JSON row alone
    assert reloaded == tasks
    for task in reloaded:
        assert task.prompt.endswith(ANSWER_INSTRUCTION) and task.question in task.prompt
        assert score_reply(task, f"Let me think.\n<answer>{task.answer}</answer>") == 1.0
        assert score_reply(task, f"Let me think.\n{task.answer}") == 1.0  # the last line, without tags
        assert score_reply(task, "<answer>#</answer>") == 0.0  # shares no character with any answer
        assert score_reply(task, "") == 0.0
        assert score_reply(task, task.answer, ExtractMode.TAG) == 0.0  # TAG mode needs the tags


@needs_gym
def test_generation_is_deterministic_and_difficulty_changes_the_items() -> None:
    first = generate_rows("chain_sum", 6, seed=11, difficulty=0)
    assert first == generate_rows("chain_sum", 6, seed=11, difficulty=0)
    assert first[:3] == generate_rows("chain_sum", 3, seed=11, difficulty=0)  # item i does not depend on n
    harder = generate_rows("chain_sum", 6, seed=11, difficulty=2)
    assert max(len(t.answer.lstrip("-")) for t in harder) > max(len(t.answer.lstrip("-")) for t in first)
    assert first[0].task_id == "chain_sum-d0-s11-00000" and isinstance(first[0], ProceduralTask)


@needs_gym
@pytest.mark.parametrize(
    "dataset, message",
    [
        pytest.param("no_such_dataset", "is not a reasoning-gym dataset", id="unknown"),
    ],
)
def test_bad_dataset(dataset: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_rows(dataset, 1, seed=0)
