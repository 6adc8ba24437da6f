"""The `instruction` environment: a request with programmatically verifiable constraints (IFEval's kinds),
answered in one reply by the `chat` harness; the reply is scored by checks.py, outside any sandbox (nothing
the agent wrote is executed).

Task rows (a task set's tasks.jsonl; `harnessrl tasks instruction` writes them):
    {"instance_id": "if-s0-00003", "environment": "instruction", "problem_statement": "<the full request>",
     "constraints": [{"kind": "ends_with", "args": {"phrase": "That is all."}}, ...]}

Rewards (a spec's `reward`): `instruction_fraction` (default: the share of constraints the reply meets —
partial credit), `instruction_strict` (1 when it meets all), `instruction_loose` (IFEval's loose share: a
preamble line, a closing line or markdown stars forgiven). The reward's parts are each constraint's 1/0 and
`on_task`: every reward is 0 for a reply that does not answer its request at all — cut off by its budget,
under 5 words, an echo of the request, filler (guard.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.environments.instruction.guard import off_task
from harnessrl.environments.instruction.prompts import InstructionTask, WholeReply, task_from_row
from harnessrl.harness.base import EpisodeEnd
from harnessrl.schema import HarnessName, HarnessSpec

if TYPE_CHECKING:
    from harnessrl.taskset import TaskSet

FRACTION, STRICT, LOOSE = "instruction_fraction", "instruction_strict", "instruction_loose"
EVAL_GROUP = "eval_group"  # an optional row field: the evaluation reports its groups apart
ON_TASK = "on_task"  # the guard's part: 1 when the reply answers its request at all (guard.py)


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
        met = sum(scored.passed)
        detail = f"{met} of {len(task.constraints)} constraints met"
        cut_off = finished.rollout.get("finish_reason") == EpisodeEnd.TOKEN_BUDGET
        why = off_task(finished.answer, task.prompt, cut_off=cut_off)
        parts[ON_TASK] = float(why is None)
        if why is not None:  # form without an answer earns nothing (guard.py)
            return Reward(0.0, parts, detail=f"off task: {why}; {detail}")
        total = {FRACTION: scored.fraction, STRICT: float(scored.strict), LOOSE: scored.loose_fraction}[
            reward
        ]
        return Reward(total, parts, detail=detail)


class PromptSplit(StrEnum):
    """Which base requests a task set draws from: `train` and `test` never share one, so a held-out set
    tests the skill, not memory of the request."""

    TRAIN = "train"  # the even-numbered base requests
    TEST = "test"  # the odd-numbered ones
    ALL = "all"


def instruction_rows(
    n: int,
    seed: int,
    split: PromptSplit = PromptSplit.ALL,
    constraints_per_task: tuple[int, ...] = (1,),
    kinds: tuple[str, ...] | None = None,
    *,
    whole_reply: WholeReply | None = None,
    eval_group: str | None = None,
) -> list[dict[str, Any]]:
    """Task-set rows of `n` generated instruction tasks (prompts.generate_rows: task i depends on (seed, i));
    `eval_group` tags each row for an evaluation that reports groups apart (e.g. held-out tasks of constraint
    kinds never trained)."""
    from harnessrl.environments.instruction.prompts import generate_rows, load_base_prompts

    bases = load_base_prompts()
    if split is not PromptSplit.ALL:
        bases = bases[0 if split is PromptSplit.TRAIN else 1 :: 2]
    tasks = generate_rows(n, seed, constraints_per_task, kinds, base_prompts=bases, whole_reply=whole_reply)
    rows = [task_row(t) for t in tasks]
    if eval_group:
        for row in rows:
            row[EVAL_GROUP] = eval_group
    return rows


def write_instruction_taskset(
    out: str | Path,
    n: int,
    seed: int,
    split: PromptSplit = PromptSplit.ALL,
    constraints_per_task: tuple[int, ...] = (1,),
    kinds: tuple[str, ...] | None = None,
    *,
    whole_reply: WholeReply | None = None,
    eval_group: str | None = None,
) -> TaskSet:
    """A task set of `n` generated instruction tasks (`instruction_rows`)."""
    from harnessrl.taskset import write_taskset

    rows = instruction_rows(
        n, seed, split, constraints_per_task, kinds, whole_reply=whole_reply, eval_group=eval_group
    )
    shape = f", whole replies of >= {whole_reply.min_words} words" if whole_reply else ""
    source = f"instruction: {n} tasks, seed {seed}, {split} requests, constraints {list(constraints_per_task)}{shape}"
    return write_taskset(out, rows, {}, source, {"environment": "instruction", "split": str(split)})
