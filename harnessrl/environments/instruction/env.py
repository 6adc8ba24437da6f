"""The `instruction` environment: a request with programmatically verifiable constraints (IFEval's kinds),
answered in one reply by the `chat` harness; the reply is scored by checks.py, outside any sandbox (nothing
the agent wrote is executed).

Task rows (a task set's tasks.jsonl; `harnessrl tasks instruction` writes them):
    {"instance_id": "if-s0-00003", "environment": "instruction", "problem_statement": "<the full request>",
     "constraints": [{"kind": "ends_with", "args": {"phrase": "That is all."}}, ...]}

Rewards (a spec's `reward`): `instruction_fraction` (default: the share of constraints the reply meets —
partial credit), `instruction_strict` (1 when it meets all), `instruction_loose` (IFEval's loose share: a
preamble line, a closing line or markdown stars forgiven). The reward's parts are each constraint's 1/0.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.environments.instruction.prompts import InstructionTask, task_from_row
from harnessrl.schema import HarnessName, HarnessSpec

if TYPE_CHECKING:
    from harnessrl.taskset import TaskSet

FRACTION, STRICT, LOOSE = "instruction_fraction", "instruction_strict", "instruction_loose"


def instruction_task(row: Mapping[str, Any]) -> InstructionTask:
    """The task a row holds (ValueError naming the task and the field)."""
    where = f"task {row.get('instance_id')!r}"
    return task_from_row(
        {
            "task_id": row.get("instance_id"),
            "prompt": row.get("problem_statement"),
            "constraints": row.get("constraints"),
        },
        where,
    )


def task_row(task: InstructionTask) -> dict[str, Any]:
    """The task-set row of a task (the inverse of `instruction_task`)."""
    return {
        "instance_id": task.task_id,
        "environment": "instruction",
        "problem_statement": task.prompt,
        "constraints": [c.to_json() for c in task.constraints],
    }


class InstructionEnvironment(Environment):
    name: str = "instruction"
    reward_names: tuple[str, ...] = (FRACTION, STRICT, LOOSE)

    def check_task(self, row: Mapping[str, Any]) -> None:
        instruction_task(row)

    def episode(self, row: Mapping[str, Any]) -> Episode:
        spec = HarnessSpec(
            harness=HarnessName.CHAT, tools=[], reward=FRACTION, limits={"tokens": 256, "wall_s": 300}
        )
        return Episode(prompt=instruction_task(row).prompt, workspace=False, default_spec=spec)

    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward:
        task = instruction_task(row)
        scored = task.score(finished.answer)
        parts = {
            f"{c.kind}#{i}": float(ok)
            for i, (c, ok) in enumerate(zip(task.constraints, scored.passed, strict=True))
        }
        total = {FRACTION: scored.fraction, STRICT: float(scored.strict), LOOSE: scored.loose_fraction}[
            reward
        ]
        met = sum(scored.passed)
        return Reward(total, parts, detail=f"{met} of {len(task.constraints)} constraints met")


class PromptSplit(StrEnum):
    """Which base requests a task set draws from: `train` and `test` never share one, so a held-out set
    tests the skill, not memory of the request."""

    TRAIN = "train"  # the even-numbered base requests
    TEST = "test"  # the odd-numbered ones
    ALL = "all"


def write_instruction_taskset(
    out: str | Path,
    n: int,
    seed: int,
    split: PromptSplit = PromptSplit.ALL,
    constraints_per_task: tuple[int, ...] = (1,),
    kinds: tuple[str, ...] | None = None,
) -> TaskSet:
    """A task set of `n` generated instruction tasks (prompts.generate_rows: task i depends on (seed, i))."""
    from harnessrl.environments.instruction.prompts import generate_rows, load_base_prompts
    from harnessrl.taskset import write_taskset

    bases = load_base_prompts()
    if split is not PromptSplit.ALL:
        bases = bases[0 if split is PromptSplit.TRAIN else 1 :: 2]
    tasks = generate_rows(n, seed, constraints_per_task, kinds, base_prompts=bases)
    rows = [task_row(t) for t in tasks]
    source = (
        f"instruction: {n} tasks, seed {seed}, {split} requests, constraints {list(constraints_per_task)}"
    )
    return write_taskset(out, rows, {}, source, {"environment": "instruction", "split": str(split)})
