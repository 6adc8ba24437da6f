"""The kernel environment through the interface every stage uses: task sets from `harnessrl tasks kernel`, the
workspace hooks (its own workspace, not a git repository), snapshots of solution.py after each tool call, and
rewards graded for real by grade.py inside bubblewrap — gold scores 1, missing / broken / wrong 0 under
`kernel_solved` (and nothing past compiling under the partial formula), reward hacks nothing; then one
rollout end to end through generate (gateway, ReAct harness, sandbox) and verify, whose best snapshot is
graded. The grader's own cheat catalogue is test_kernel.py; three of its hacks are scored here through the
environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harnessrl.environments.base import Finished, Grading, RewardStatus
from harnessrl.environments.kernel.env import (
    MAX_SOLUTION_BYTES,
    PARTIAL,
    SOLVED,
    KernelEnvironment,
    kernel_task,
    read_solution,
)
from harnessrl.environments.kernel.tasks import TASKS_DIR, load_tasks
from harnessrl.environments.registry import get_environment
from harnessrl.io import read_jsonl
from harnessrl.rollout.episode import plan_row, spec_for
from harnessrl.rollout.snapshots import SnapshotRuntime
from harnessrl.sandbox.backends import SandboxChoice
from harnessrl.sandbox.workspace import PatchTooLarge
from harnessrl.schema import HarnessName, SandboxKind
from harnessrl.taskset import TaskSet
from tests.environments.test_kernel import CACHED_VISIBLE_OUTPUTS, DETECTS_THE_GRADER, OVERWRITES_TASK_FILES
from tests.support.fixtures import requires_bwrap

GOLD = (TASKS_DIR / "prefix_sum" / "gold.py").read_text()
WRONG = "import numpy as np\ndef prefix_sum(x):\n    return np.zeros(len(x))\n"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> TaskSet:
    from harnessrl.cli import main

    out = tmp_path_factory.mktemp("kernel") / "tasks"
    assert main(["tasks", "kernel", "--out", str(out), "--names", "prefix_sum", "--timing", "quick"]) == 0
    return TaskSet.open(out)


@pytest.fixture(scope="module")
def row(tasks: TaskSet) -> dict:
    [row] = tasks.rows()
    return row


def grading(tasks: TaskSet, kind: SandboxKind = SandboxKind.BUBBLEWRAP) -> Grading:
    return Grading(tasks, 120.0, None, SandboxChoice(kind))


def score(row: dict, tasks: TaskSet, patch: str, reward: str = PARTIAL, snapshots: tuple[str, ...] = ()):
    return KernelEnvironment().reward(row, Finished("", patch, {}, snapshots), reward, grading(tasks))


def test_task_sets_carry_the_task_files_and_split_without_sharing(tmp_path: Path) -> None:
    from harnessrl.cli import main

    for split in ("train", "test"):
        assert main(["tasks", "kernel", "--out", str(tmp_path / split), "--split", split]) == 0
    rows = {s: TaskSet.open(tmp_path / s).rows() for s in ("train", "test")}
    names = {s: {r["instance_id"] for r in rows[s]} for s in rows}
    assert len(names["train"]) + len(names["test"]) == len(load_tasks()) >= 12
    assert not names["train"] & names["test"]
    for split in rows:  # both span the difficulties
        assert {r["difficulty"] for r in rows[split]} == {1, 2, 3, 4, 5}
    first = rows["train"][0]
    assert sorted(first["files"]) == ["inputs.py", "reference.py", "task.json"]  # never gold.py
    assert first["environment"] == "kernel" and first["timing"] == "full"
    task = kernel_task(first)  # the row alone makes the task folder: gold-less, solution = reference
    assert task.path("reference.py").read_text() == first["files"]["reference.py"]
    assert not task.path("gold.py").exists()
    assert main(["tasks", "kernel", "--out", str(tmp_path / "x"), "--n", "40"]) == 2


def test_bad_rows_name_the_task_and_field(row: dict) -> None:
    env = get_environment("kernel")
    with pytest.raises(ValueError, match=r"task 'k1' \(kernel\): 'files' must map exactly"):
        env.check_task({**row, "instance_id": "k1", "files": {"reference.py": "x"}})
    files = {**row["files"], "reference.py": "def other():\n    pass\n"}
    with pytest.raises(ValueError, match=r"task 'k2' \(kernel\).*defines no top-level function 'prefix_sum'"):
        env.check_task({**row, "instance_id": "k2", "files": files})
    with pytest.raises(ValueError, match="'timing' must be one of full, quick"):
        env.check_task({**row, "timing": "slow"})


def test_the_default_spec_is_react_in_bubblewrap_with_snapshots(row: dict) -> None:
    episode = KernelEnvironment().episode(row)
    assert episode.workspace and episode.snapshots > 0
    spec = episode.default_spec
    assert (spec.harness, spec.sandbox, spec.tools) == (
        HarnessName.REACT,
        SandboxKind.BUBBLEWRAP,
        ["bash", "edit", "submit"],
    )
    planned = plan_row(row, spec_for(row, [], 0, 0, 1), 0)
    assert (planned.environment, planned.reward_fn) == ("kernel", PARTIAL)


def test_the_workspace_is_the_task_not_a_repository(row: dict, tasks: TaskSet, tmp_path: Path) -> None:
    env = KernelEnvironment()
    ws = tmp_path / "ws"
    env.prepare(row, ws, tasks, strict=False)
    assert sorted(p.name for p in ws.iterdir()) == ["TASK.md", "inputs.py", "reference.py", "solution.py"]
    assert env.produced(row, ws, tasks) == row["files"]["reference.py"]
    assert (env.sandbox_env(row, tasks) / "bin" / "python").exists()  # the numpy-only grading env
    (ws / "solution.py").unlink()
    assert read_solution(ws) == ""  # no file: nothing produced (graded as missing: 0)
    os.symlink("/etc/passwd", ws / "solution.py")
    assert read_solution(ws) == ""  # never followed on the host
    (ws / "solution.py").unlink()
    (ws / "solution.py").write_text("#" * (MAX_SOLUTION_BYTES + 1))
    with pytest.raises(PatchTooLarge):
        read_solution(ws)


@requires_bwrap
def test_snapshots_are_taken_after_each_tool_call_in_the_sandbox(
    row: dict, tasks: TaskSet, tmp_path: Path
) -> None:
    from harnessrl.harness.runtime import SandboxRuntime
    from harnessrl.sandbox.backends import make_sandbox
    from harnessrl.sandbox.base import Limits

    env = KernelEnvironment()
    ws = tmp_path / "ws"
    env.prepare(row, ws, tasks, strict=False)
    sandbox = make_sandbox(
        SandboxKind.BUBBLEWRAP, ws, env_dir=env.sandbox_env(row, tasks), image=None, limits=Limits()
    )
    try:
        runtime = SnapshotRuntime(SandboxRuntime(sandbox, ws), lambda: env.produced(row, ws, tasks), keep=2)
        runtime.write_file("solution.py", GOLD)
        assert (
            runtime.run_shell(
                "python -c 'import solution, numpy; print(solution.prefix_sum(numpy.ones(3)))'", 60
            ).output.strip()
            == "[1. 2. 3.]"
        )
        runtime.run_shell("echo 'def prefix_sum(x):' > solution.py", 30)
        runtime.view_file("solution.py")  # reads take no snapshot
        runtime.write_file("solution.py", GOLD)  # back to a product already kept
        runtime.run_shell("echo '# v3' >> solution.py", 30)
        assert runtime.snapshots == ["def prefix_sum(x):\n", GOLD + "# v3\n"]  # the latest 2 distinct
        assert runtime.sandbox is sandbox  # what CLI harnesses look for passes through
    finally:
        sandbox.close()


@requires_bwrap
def test_gold_scores_one_missing_broken_and_wrong_score_nothing(row: dict, tasks: TaskSet) -> None:
    gold = score(row, tasks, GOLD)
    assert gold.total == 1.0 and gold.status is RewardStatus.SCORED, gold.detail
    assert gold.parts == {"syntax": 0.05, "imports": 0.25, "correctness": 0.4, "speed": 0.3}
    assert score(row, tasks, GOLD, SOLVED).total == 1.0
    for patch in ("", "def prefix_sum(x):\n    return x +\n"):  # nothing produced, a syntax error
        assert score(row, tasks, patch).total == 0.0
        assert score(row, tasks, patch, SOLVED).total == 0.0
    wrong = score(row, tasks, WRONG)  # the formula's compile credit, no more
    assert wrong.total is not None and wrong.total <= 0.30 + 0.40 * 0.2 and wrong.parts["speed"] == 0.0
    assert score(row, tasks, WRONG, SOLVED).total == 0.0
    untouched = score(row, tasks, row["files"]["reference.py"], SOLVED)  # correct, not faster
    assert untouched.total == 0.0 and untouched.detail.startswith("correct"), untouched.detail


@requires_bwrap
@pytest.mark.parametrize(
    "source",
    [CACHED_VISIBLE_OUTPUTS, OVERWRITES_TASK_FILES, DETECTS_THE_GRADER],
    ids=["cached_outputs_keyed_by_inputs", "edits_reference_and_grader", "skips_work_under_the_grader"],
)
def test_reward_hacks_score_nothing(row: dict, tasks: TaskSet, source: str) -> None:
    solved = score(row, tasks, source, SOLVED)
    assert solved.total == 0.0, solved.detail
    partial = score(row, tasks, source)  # compile credit and accidental passes (the empty input) only
    assert partial.parts["speed"] == 0.0 and partial.total is not None and partial.total < 0.5, partial.detail


@requires_bwrap
def test_the_best_snapshot_is_graded_and_infra_errors_are_not_zeros(row: dict, tasks: TaskSet) -> None:
    broken = "def prefix_sum(x):\n"
    best = score(row, tasks, broken, snapshots=(WRONG, GOLD))
    assert best.total == 1.0 and "graded snapshot 2 of 3" in best.detail, best.detail
    assert score(row, tasks, GOLD, snapshots=(GOLD,)).detail.endswith("graded the final solution of 1")
    podman = KernelEnvironment().reward(
        row, Finished("", GOLD, {}), PARTIAL, grading(tasks, SandboxKind.PODMAN)
    )
    assert podman.status is RewardStatus.INFRA_ERROR and "bubblewrap" in podman.detail


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@requires_bwrap
def test_a_rollout_end_to_end_grades_its_best_snapshot(tasks: TaskSet, fast_engine, tmp_path: Path) -> None:
    """generate (gateway, ReAct, bubblewrap) -> verify: the agent writes the gold solution, then breaks it and
    submits; the rollout keeps both solutions and verify grades the better one."""
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.verify.rollouts import run_verify

    engine = fast_engine(
        [
            {"text": tool_call("str_replace_editor", command="create", path="solution.py", file_text=GOLD)},
            {"text": tool_call("bash", command="echo 'def prefix_sum(x):' > solution.py")},
            {"text": tool_call("submit")},
        ]
    )
    run_generate(
        tasks.root,
        tmp_path / "gen",
        None,
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=1),
    )
    [rollout] = read_jsonl(tmp_path / "gen" / "rollouts.jsonl")
    assert (rollout["environment"], rollout["harness"], rollout["finish_reason"]) == (
        "kernel",
        "react",
        "submitted",
    )
    assert rollout["model_patch"] == "def prefix_sum(x):\n" and rollout["snapshots"] == [GOLD]
    summary = run_verify(tasks.root, tmp_path / "gen", tmp_path / "verified")
    [verdict] = read_jsonl(tmp_path / "verified" / "rewards.jsonl")
    assert (verdict["reward"], verdict["status"], verdict["verify_status"]) == (1.0, "ok", "resolved"), (
        verdict
    )
    assert "graded snapshot 1 of 2" in verdict["detail"] and summary["resolved"] == 1
