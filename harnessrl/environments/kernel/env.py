"""The `kernel` environment: make a slow, correct Python/NumPy function fast, in a sandboxed workspace.

The agent gets a workspace of its own (not a git repository): `solution.py` (the slow reference, to edit),
`reference.py`, `inputs.py` and `TASK.md` (runner.prepare_workspace); the `react` harness's tools (bash,
edit, submit) act on it inside bubblewrap, whose Python is the numpy-only grading env (runner.kernel_env).
What the agent produced is its `solution.py` text (read on the host without following links, capped), also
snapshotted after each of its tool calls (Episode.snapshots). The reward grades the snapshots and the final
solution, each in a fresh sandbox by grade.py (pristine reference and inputs, hidden seed, the grader's own
clock, speedup measured in the same run), and keeps the best-scoring one (tasks.best_snapshot: the earliest
of equal rewards).

Task rows (a task set's tasks.jsonl; `harnessrl tasks kernel` writes them from the task folders under
tasks/): the task's files travel in the row, so a task set is self-contained (gold.py never does):
    {"instance_id": "kernel-prefix_sum", "environment": "kernel", "problem_statement": "<what the agent sees>",
     "function": "prefix_sum", "difficulty": 1, "timing": "full" | "quick",
     "files": {"reference.py": "...", "inputs.py": "...", "task.json": "..."}}
`timing`: `full` times at the task's timing_size, `quick` at its quick_timing_size (CPU-sized runs).

Rewards: `kernel_partial` (default; 0.05 parses + 0.25 imports + 0.40 x pass rate + 0.30 x min(speedup / 2,
1) x pass rate: the untouched solution scores ~0.85, a correct 2x-faster one 1.0, a missing or unparsable
one 0) and `kernel_solved` (1 when every test passes and the speedup is at least 2, else 0). Parts: the
formula's four terms of the graded snapshot. Grading uses the kernel grader's own limits and timeout (grade.py
bounds every candidate call; runner.DEFAULT_TIMEOUT_S only catches a stopped grader), in bubblewrap.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.environments.kernel.tasks import (
    PRISTINE_FILES,
    TASKS_DIR,
    KernelTask,
    SnapshotScore,
    best_snapshot,
    load_task,
    load_tasks,
)
from harnessrl.schema import HarnessName, HarnessSpec, SandboxKind

if TYPE_CHECKING:
    from harnessrl.environments.kernel.runner import GradeReport
    from harnessrl.taskset import TaskSet

PARTIAL, SOLVED = "kernel_partial", "kernel_solved"
MAX_SOLUTION_BYTES = 256 << 10  # a larger solution.py is the agent's doing: patch_too_large, scored 0
SNAPSHOTS = 4  # distinct earlier solutions kept per rollout; with the final one at most 5 grades
SYSTEM_PROMPT = (
    "You are a performance engineer. Make the function in solution.py faster without changing its results. "
    "Use the tools to read the files, edit solution.py and run python to test it. Call exactly one tool per "
    "turn. When you are done, call submit."
)
_lock = threading.Lock()


class Timing(StrEnum):
    FULL = "full"  # the task's timing_size
    QUICK = "quick"  # its quick_timing_size


class KernelSplit(StrEnum):
    """Which task folders a task set draws from: in (difficulty, name) order, `train` takes every other one
    from the first, `test` the rest, so both span the difficulties and never share a task."""

    TRAIN = "train"
    TEST = "test"
    ALL = "all"


def prompt(task: KernelTask) -> str:
    return (
        f"{task.statement}\n\nYour current directory holds solution.py (edit it; keep the function "
        f"`{task.function}` and its signature), reference.py (the correct slow version) and inputs.py "
        "(`generate(seed, size)` makes inputs like the grader's). Grading runs solution.py on hidden inputs, "
        "checks every output against the reference and times both: reward = 0.05 (parses) + 0.25 (imports) "
        "+ 0.40 x pass rate + 0.30 x min(speedup / 2, 1) x pass rate. Call submit when you are done."
    )


def task_row(task: KernelTask, timing: Timing = Timing.FULL) -> dict[str, Any]:
    """The task-set row of a task folder: its pristine files inline (never gold.py)."""
    return {
        "instance_id": f"kernel-{task.name}",
        "environment": "kernel",
        "problem_statement": prompt(task),
        "function": task.function,
        "difficulty": task.difficulty,
        "timing": str(Timing(timing)),
        "files": {name: task.path(name).read_text() for name in PRISTINE_FILES},
    }


def kernel_task(row: Mapping[str, Any]) -> KernelTask:
    """The task a row holds, as a task folder (cached by content; ValueError naming the task and field)."""
    where = f"task {row.get('instance_id')!r} (kernel)"
    files = row.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(PRISTINE_FILES):
        raise ValueError(f"{where}: 'files' must map exactly {', '.join(PRISTINE_FILES)} to their text")
    if not all(isinstance(v, str) for v in files.values()):
        raise ValueError(f"{where}: 'files' values must be the files' text")
    if row.get("timing", Timing.FULL) not in tuple(Timing):
        raise ValueError(f"{where}: 'timing' must be one of {', '.join(Timing)}, got {row.get('timing')!r}")
    try:
        name = json.loads(files["task.json"])["name"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{where}: files['task.json'] is not a task.json with a 'name'") from None
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{where}: files['task.json'] name {name!r} is not a task folder name")
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    directory = _task_cache() / digest / name
    if not (directory / ".ready").is_file():
        _write_task(directory, files)
    try:
        return load_task(directory, gold=False)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _task_cache() -> Path:
    from harnessrl.sandbox.workspace import cache_root

    return cache_root() / "kernel-tasks"


def _write_task(directory: Path, files: Mapping[str, str]) -> None:
    """Writes the folder once (another thread or process may race: the first rename wins)."""
    with _lock:
        if (directory / ".ready").is_file():
            return
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            for filename, text in files.items():
                (tmp / filename).write_text(text)
            (tmp / "solution.py").write_text(files["reference.py"])  # what the agent starts from
            (tmp / ".ready").write_text("")
            try:
                os.rename(tmp, directory)
            except OSError:
                if not (directory / ".ready").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def read_solution(workspace: Path) -> str:
    """The agent's solution.py as the host reads it: never through a link, a regular file only, at most
    MAX_SOLUTION_BYTES (sandbox.workspace.PatchTooLarge over that); "" when there is none."""
    from harnessrl.sandbox.workspace import PatchTooLarge

    try:
        fd = os.open(workspace / "solution.py", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, a link, a FIFO without writer...: no solution
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        data = f.read(MAX_SOLUTION_BYTES + 1)
    if len(data) > MAX_SOLUTION_BYTES:
        raise PatchTooLarge(MAX_SOLUTION_BYTES)  # not kept: the rollout is patch_too_large, scored 0
    return data.decode("utf-8", errors="replace")


class KernelEnvironment(Environment):
    name: str = "kernel"
    reward_names: tuple[str, ...] = (PARTIAL, SOLVED)

    def check_task(self, row: Mapping[str, Any]) -> None:
        kernel_task(row)

    def episode(self, row: Mapping[str, Any]) -> Episode:
        spec = HarnessSpec(
            harness=HarnessName.REACT,
            tools=["bash", "edit", "submit"],
            sandbox=SandboxKind.BUBBLEWRAP,
            reward=PARTIAL,
            # SmolLM2-135M: 8k context, ~20-40 tokens/s per rollout on 2 busy cores
            limits={"turns": 6, "tokens": 4096, "wall_s": 300, "tool_timeout_s": 30},
            options={"max_tokens_per_turn": 256, "system_prompt": SYSTEM_PROMPT},
        )
        return Episode(
            prompt=str(row["problem_statement"]), workspace=True, default_spec=spec, snapshots=SNAPSHOTS
        )

    # -- workspace hooks (environments.base.WorkspaceHooks) ------------------------------------------------
    def prepare(self, row: Mapping[str, Any], dest: Path, taskset: TaskSet, strict: bool) -> None:
        from harnessrl.environments.kernel.runner import prepare_workspace

        shutil.rmtree(dest, ignore_errors=True)
        prepare_workspace(kernel_task(row), dest)

    def sandbox_env(self, row: Mapping[str, Any], taskset: TaskSet) -> Path:
        from harnessrl.environments.kernel.runner import kernel_env

        return kernel_env()

    def produced(self, row: Mapping[str, Any], workspace: Path, taskset: TaskSet) -> str:
        return read_solution(workspace)

    # -- reward ---------------------------------------------------------------------------------------------
    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward:
        from harnessrl.environments.kernel.runner import grade_solution

        task = kernel_task(row)
        iid = row.get("instance_id")
        if grading.sandbox.kind not in (SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT):
            return Reward.failed(
                f"task {iid}: kernel grading runs in bubblewrap (its numpy-only env), not {grading.sandbox.kind}"
            )
        candidates = _distinct([*finished.snapshots, finished.patch])[-(SNAPSHOTS + 1) :]
        reports: list[GradeReport] = []
        for source in candidates:
            report = grade_solution(task, source or None, quick=row.get("timing") == Timing.QUICK)
            if report.reward is None:  # the sandbox or the grader broke: nobody's score
                return Reward.failed(f"task {iid}: kernel grading failed ({report.status}): {report.detail}")
            reports.append(report)
        best = int(
            best_snapshot(SnapshotScore(str(i), r.reward or 0.0) for i, r in enumerate(reports)).snapshot_id
        )
        report = reports[best]
        parts = {k: float(v) for k, v in (report.raw.get("reward_parts") or {}).items()}
        solved = report.status == "correct" and (report.reward or 0.0) >= 1.0
        total = float(solved) if reward == SOLVED else float(report.reward or 0.0)
        which = "the final solution" if best == len(reports) - 1 else f"snapshot {best + 1}"
        detail = (
            f"{report.status}: {report.tests_passed}/{report.tests_total} tests, speedup {report.speedup:.2f}x"
            f"{' (noisy)' if report.noisy else ''}; graded {which} of {len(reports)}"
            + (f" ({report.detail[:200]})" if report.detail else "")
        )
        return Reward(total, parts, detail=detail)


def _distinct(items: Sequence[str]) -> list[str]:
    """Each item once, at its last position (the final solution stays last)."""
    last = {item: i for i, item in enumerate(items)}
    return [item for i, item in enumerate(items) if last[item] == i]


def select_tasks(
    n: int | None,
    seed: int,
    split: KernelSplit = KernelSplit.ALL,
    names: Sequence[str] | None = None,
    difficulties: Sequence[int] | None = None,
    root: Path = TASKS_DIR,
) -> list[KernelTask]:
    """`n` task folders (None: all that match), in an order shuffled by `seed`; ValueError when fewer match."""
    tasks = load_tasks(root)
    if split is not KernelSplit.ALL:
        tasks = tasks[0 if split is KernelSplit.TRAIN else 1 :: 2]
    if names:
        unknown = sorted(set(names) - {t.name for t in load_tasks(root)})
        if unknown:
            raise ValueError(f"no kernel task(s) {unknown} in {root}")
        tasks = [t for t in tasks if t.name in names]
    if difficulties:
        tasks = [t for t in tasks if t.difficulty in difficulties]
    random.Random(seed).shuffle(tasks)
    if n is not None and n > len(tasks):
        raise ValueError(
            f"{n} kernel tasks asked for, {len(tasks)} match (split {split}, names {list(names or [])}, "
            f"difficulties {list(difficulties or [])}) in {root}"
        )
    return tasks if n is None else tasks[:n]


def write_kernel_taskset(
    out: str | Path,
    n: int | None,
    seed: int,
    split: KernelSplit = KernelSplit.ALL,
    timing: Timing = Timing.FULL,
    names: Sequence[str] | None = None,
    difficulties: Sequence[int] | None = None,
    root: Path = TASKS_DIR,
) -> TaskSet:
    """A task set of kernel tasks (select_tasks), their files inline."""
    from harnessrl.taskset import write_taskset

    tasks = select_tasks(n, seed, split, names, difficulties, root)
    rows = [task_row(t, timing) for t in tasks]
    source = f"kernel: {len(rows)} tasks from {root}, seed {seed}, {split} split, {timing} timing"
    return write_taskset(out, rows, {}, source, {"environment": "kernel", "split": str(split)})
