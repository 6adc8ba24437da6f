"""The kernel environment's task list: one typed, validated record per folder under `tasks/`, and the rule
that picks which snapshot of a trajectory is graded.

    load_tasks(root=TASKS_DIR) -> list[KernelTask]      (sorted by difficulty, then name)
    load_task(directory, gold=True) -> KernelTask       (gold=False: a task as a task set carries it, no gold.py)
    best_snapshot(scores) -> SnapshotScore

A task folder `tasks/<name>/` holds `reference.py` (slow, correct; also what the agent starts from: its
workspace's `solution.py` is the reference copied), `gold.py` (a fast correct version; never enters a sandbox),
`inputs.py` (`generate(seed, size) -> tuple` of positional arguments: the grader's hidden inputs) and
`task.json`:

    {"name": <folder name>, "function": <the function the three modules define>, "difficulty": 1..5,
     "statement": <shown to the agent>, "correctness_sizes": [int >= 0, ...], "timing_size": int >= 1,
     "quick_timing_size": int >= 1 (tests and smoke runs), "rtol": float >= 0, "atol": float >= 0,
     "timeout_factor": float >= 1 (optional, default 20: a call may take this many times the reference)}

Invariants checked here, each failure one `TaskError` naming the folder, the file or field, and the fix: the
four files exist; `name` equals the folder name; `function` is defined at the top level of reference.py and
gold.py (read with `ast`, nothing is imported) and inputs.py defines `generate`; the numbers are in range.
"""

from __future__ import annotations

import ast
import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).parent / "tasks"
TASK_FILES = ("reference.py", "gold.py", "inputs.py", "task.json")
# what the grader's sandbox gets of a task (never gold.py, never the agent's copies)
PRISTINE_FILES = ("reference.py", "inputs.py", "task.json")
MIN_DIFFICULTY, MAX_DIFFICULTY = 1, 5


class TaskError(ValueError):
    """A task folder that does not hold a valid task (the message names the folder, the field and the fix)."""


@dataclass(frozen=True)
class KernelTask:
    name: str
    function: str
    difficulty: int
    statement: str
    correctness_sizes: tuple[int, ...]
    timing_size: int
    quick_timing_size: int
    rtol: float
    atol: float
    timeout_factor: float
    directory: Path

    def path(self, filename: str) -> Path:
        return self.directory / filename


@dataclass(frozen=True)
class SnapshotScore:
    """The reward one snapshot of a trajectory (the agent's solution.py at one step) was graded with."""

    snapshot_id: str
    reward: float


def load_tasks(root: Path = TASKS_DIR) -> list[KernelTask]:
    """Every task folder below `root` (a folder with a task.json), validated; sorted by difficulty, name."""
    if not root.is_dir():
        raise TaskError(f"{root}: no such task directory")
    tasks = [load_task(d) for d in sorted(root.iterdir()) if d.is_dir() and (d / "task.json").exists()]
    if not tasks:
        raise TaskError(f"{root}: holds no task folder (a folder with a task.json)")
    log.debug("loaded %d kernel tasks from %s", len(tasks), root)
    return sorted(tasks, key=lambda t: (t.difficulty, t.name))


def load_task(directory: Path, gold: bool = True) -> KernelTask:
    directory = Path(directory)
    for filename in TASK_FILES if gold else tuple(f for f in TASK_FILES if f != "gold.py"):
        if not (directory / filename).is_file():
            raise TaskError(
                f"task {directory}: missing {filename}; every task folder needs {', '.join(TASK_FILES)}"
            )
    where = f"task {directory}: task.json"
    try:
        raw = json.loads((directory / "task.json").read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{where} is not valid JSON ({e}); fix the file") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{where} must hold a JSON object")
    name = _str(raw, "name", where)
    if name != directory.name:
        raise TaskError(
            f"{where}: name {name!r} differs from the folder name {directory.name!r}; make them equal"
        )
    function = _str(raw, "function", where)
    if not function.isidentifier():
        raise TaskError(f"{where}: function {function!r} is not a Python identifier")
    difficulty = _int(raw, "difficulty", where, MIN_DIFFICULTY)
    if difficulty > MAX_DIFFICULTY:
        raise TaskError(f"{where}: difficulty {difficulty} is over {MAX_DIFFICULTY}; use 1..{MAX_DIFFICULTY}")
    sizes = raw.get("correctness_sizes")
    if not isinstance(sizes, list) or not sizes:
        raise TaskError(f"{where}: correctness_sizes must be a non-empty list of ints >= 0")
    for i, size in enumerate(sizes):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TaskError(f"{where}: correctness_sizes[{i}] = {size!r} must be an int >= 0")
    task = KernelTask(
        name=name,
        function=function,
        difficulty=difficulty,
        statement=_str(raw, "statement", where),
        correctness_sizes=tuple(sizes),
        timing_size=_int(raw, "timing_size", where, 1),
        quick_timing_size=_int(raw, "quick_timing_size", where, 1),
        rtol=_float(raw, "rtol", where, 0.0, default=0.0),
        atol=_float(raw, "atol", where, 0.0, default=0.0),
        timeout_factor=_float(raw, "timeout_factor", where, 1.0, default=20.0),
        directory=directory,
    )
    for filename in ("reference.py", "gold.py") if gold else ("reference.py",):
        _require_def(directory / filename, function)
    _require_def(directory / "inputs.py", "generate")
    return task


def best_snapshot(scores: Iterable[SnapshotScore | tuple[str, float]]) -> SnapshotScore:
    """The snapshot a trajectory is graded by: the highest reward; among equal rewards the earliest (the
    agent reached it first, and later equal snapshots add nothing). Raises ValueError on an empty list or a
    reward that is not a finite number (naming its position)."""
    best: SnapshotScore | None = None
    for i, item in enumerate(scores):
        s = item if isinstance(item, SnapshotScore) else SnapshotScore(str(item[0]), item[1])
        if (
            not isinstance(s.reward, (int, float))
            or isinstance(s.reward, bool)
            or not math.isfinite(s.reward)
        ):
            raise ValueError(f"snapshot #{i} ({s.snapshot_id!r}): reward {s.reward!r} is not a finite number")
        if best is None or s.reward > best.reward:
            best = s
    if best is None:
        raise ValueError("no snapshots to choose from: a trajectory needs at least one graded snapshot")
    return best


def _require_def(path: Path, name: str) -> None:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        raise TaskError(
            f"task {path.parent}: {path.name} does not parse ({e.msg}, line {e.lineno})"
        ) from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        raise TaskError(f"task {path.parent}: {path.name} defines no top-level function {name!r}; add it")


def _str(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return value


def _int(raw: dict[str, Any], key: str, where: str, minimum: int) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise TaskError(f"{where}: field {key!r} must be an int >= {minimum}, got {value!r}")
    return value


def _float(raw: dict[str, Any], key: str, where: str, minimum: float, *, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise TaskError(f"{where}: field {key!r} must be a number >= {minimum}, got {value!r}")
    if value < minimum:
        raise TaskError(f"{where}: field {key!r} = {value} is below {minimum}")
    return float(value)
