"""The `procedural` environment: reasoning-gym tasks (generated with a seed, difficulty as a parameter),
answered in one reply by the `chat` harness, scored by the dataset's own `score_answer` (source.py).

Task rows (a task set's tasks.jsonl; `harnessrl tasks procedural` writes them): source.py's row, with the
task set's field names:
    {"instance_id": "chain_sum-d0-s3-00007", "environment": "procedural", "problem_statement": "<prompt>",
     "answer": "12", "metadata": {"dataset", "difficulty", "seed", "index", "question", "entry"}}

Rewards: `procedural_exact` (default: 1 when the dataset's own scorer gives the extracted answer full marks —
the last <answer>...</answer>, else the last line — and 0 otherwise), `procedural_tagged` (the same, but
only an answer inside <answer> tags counts) and `procedural_number` (the same, but without tags the reply's
last number is the answer, GSM8K-style: "5 + 8 = 13" answers 13; a task whose answer is not a number reads
the last line). The scorer's raw value is the reward's part `score`: many
datasets give partial credit to a reply that merely contains the answer (len(answer) / len(reply)), which a
list of candidates collects, so the rewards count full marks only.

Datasets: only those in REVIEWED_DATASETS, whose scorers were read and compare strings or numbers; others
are refused, since a scorer runs on the agent's text in the verify process, outside any sandbox, and some
reasoning-gym scorers evaluate it as code (sympy's parse_expr, eval). reasoning-gym is imported on first use.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.environments.procedural.source import (
    ExtractMode,
    ProceduralTask,
    extract_answer,
    generate_rows,
    score_answer,
    task_from_row,
)
from harnessrl.schema import HarnessName, HarnessSpec

if TYPE_CHECKING:
    from harnessrl.taskset import TaskSet

EXACT, TAGGED, NUMBER = "procedural_exact", "procedural_tagged", "procedural_number"
EXTRACTION = {
    EXACT: ExtractMode.TAG_OR_LAST_LINE,
    TAGGED: ExtractMode.TAG,
    NUMBER: ExtractMode.TAG_OR_FINAL_NUMBER,
}
# Scorers read (reasoning-gym 0.1.25): string or Decimal comparisons, no eval of the answer.
REVIEWED_DATASETS = (
    "basic_arithmetic",
    "chain_sum",
    "count_bits",
    "gcd",
    "lcm",
    "leg_counting",
    "letter_counting",
    "products",
    "spell_backward",
    "word_sorting",
)


def procedural_task(row: Mapping[str, Any]) -> ProceduralTask:
    """The task a row holds (ValueError naming the task and the field)."""
    where = f"task {row.get('instance_id')!r} (procedural)"
    task = task_from_row(
        {
            "task_id": row.get("instance_id"),
            "prompt": row.get("problem_statement"),
            "answer": row.get("answer"),
            "metadata": row.get("metadata"),
        },
        where,
    )
    if task.dataset not in REVIEWED_DATASETS:
        raise ValueError(
            f"{where}: dataset {task.dataset!r} is not one whose scorer was reviewed ({', '.join(REVIEWED_DATASETS)}): "
            "its scorer would run on the agent's text outside a sandbox"
        )
    return task


def task_row(task: ProceduralTask) -> dict[str, Any]:
    row = task.to_row()
    return {
        "instance_id": task.task_id,
        "environment": "procedural",
        "problem_statement": task.prompt,
        "answer": task.answer,
        "metadata": row["metadata"],
    }


class ProceduralEnvironment(Environment):
    name: str = "procedural"
    reward_names: tuple[str, ...] = (EXACT, TAGGED, NUMBER)

    def check_task(self, row: Mapping[str, Any]) -> None:
        procedural_task(row)

    def episode(self, row: Mapping[str, Any]) -> Episode:
        spec = HarnessSpec(
            harness=HarnessName.CHAT, tools=[], reward=EXACT, limits={"tokens": 64, "wall_s": 120}
        )
        return Episode(prompt=procedural_task(row).prompt, workspace=False, default_spec=spec)

    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward:
        task = procedural_task(row)
        mode = EXTRACTION.get(reward, ExtractMode.TAG_OR_LAST_LINE)
        reply = finished.answer
        if mode is ExtractMode.TAG_OR_FINAL_NUMBER:
            if _NUMERIC.fullmatch(task.answer):  # the question's own numbers are never the answer it gives
                reply = reply.replace(task.question.strip(), " ")
            else:
                mode = ExtractMode.TAG_OR_LAST_LINE  # a word answer: its last line, as `procedural_exact`
        answer = extract_answer(reply, mode)
        score = score_answer(task, answer)
        total = float(score >= 1.0)
        shown = "no answer" if answer is None else f"answer {answer[:80]!r}"
        return Reward(total, {"score": score}, detail=f"{shown}: {task.dataset} scores {score:.3g}")


_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?")

DEFAULT_DATASETS = ("chain_sum",)
MAX_DRAWN = 100_000  # items of one dataset and seed looked at to find tasks apart from `held_apart`


def questions_of(taskset: str | Path) -> set[str]:
    """The questions of a procedural task set's tasks (what a held-out set must not repeat)."""
    from harnessrl.taskset import TaskSet

    return {procedural_task(row).question for row in TaskSet.open(taskset).rows()}


def _items_apart(dataset: str, n: int, seed: int, difficulty: int, apart: set[str]) -> list[ProceduralTask]:
    """The first n items of the dataset's seed whose question is not in `apart` (item i depends only on the
    seed and i, so drawing more gives the same first items)."""
    drawn = n
    while True:
        items = [t for t in generate_rows(dataset, drawn, seed, difficulty) if t.question not in apart]
        if len(items) >= n:
            return items[:n]
        if drawn >= MAX_DRAWN:
            raise ValueError(
                f"procedural: {dataset} at difficulty {difficulty}, seed {seed}: only {len(items)} of {drawn} "
                f"items ask a question the training tasks do not; ask for fewer than {n} or a higher difficulty"
            )
        drawn = min(drawn * 4 + 16, MAX_DRAWN)


def write_procedural_taskset(
    out: str | Path,
    n: int,
    seed: int,
    datasets: Sequence[str] = DEFAULT_DATASETS,
    difficulty: int = 0,
    held_apart: Collection[str] = (),
) -> TaskSet:
    """`n` tasks, dealt round-robin over `datasets` (task i: dataset i mod len, its item i div len), each
    dataset built with `seed` at curriculum level `difficulty`. `held_apart`: questions to leave out (a
    held-out set's tasks must not repeat a training question; at a low difficulty two seeds often draw the
    same one) — the dataset's next items of the seed take their place."""
    from harnessrl.taskset import write_taskset

    if not datasets:
        raise ValueError("name at least one dataset")
    refused = [d for d in datasets if d not in REVIEWED_DATASETS]
    if refused:
        raise ValueError(
            f"dataset(s) {refused} not offered: choose from {', '.join(REVIEWED_DATASETS)} (scorers reviewed "
            "to compare, never evaluate, the agent's answer)"
        )
    apart = set(held_apart)
    per = [
        _items_apart(d, len(range(i, n, len(datasets))), seed, difficulty, apart)
        for i, d in enumerate(datasets)
    ]
    tasks = [per[i % len(datasets)][i // len(datasets)] for i in range(n)]
    rows = [task_row(t) for t in tasks]
    source = (
        f"procedural: {n} reasoning-gym tasks ({', '.join(datasets)}), seed {seed}, difficulty {difficulty}"
    )
    return write_taskset(out, rows, {}, source, {"environment": "procedural", "difficulty": difficulty})
