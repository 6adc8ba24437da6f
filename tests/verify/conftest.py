"""Fixtures for verify tests: one task of the session's synthesized task set, fresh workspaces, the gold fix."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from harnessrl.taskset import TaskSet


@dataclass
class Task:
    taskset: TaskSet
    row: dict

    @property
    def iid(self) -> str:
        return self.row["instance_id"]

    def workspace(self, dest: Path, strict: bool = False) -> Path:
        from harnessrl.components.sandbox.workspace import materialize

        return materialize(self.taskset, self.iid, dest, strict=strict)

    def apply_gold(self, ws: Path) -> None:
        """The gold fix is the reverse of the bug-introducing patch."""
        subprocess.run(["patch", "-p1", "-R", "--batch", "--quiet"], input=self.row["patch"], text=True, cwd=ws,
                       check=True)

    def module(self) -> str:
        """Path of the source file the bug was planted in."""
        return self.row["patch"].split("\n", 1)[0].split(" b/", 1)[1]


@pytest.fixture(scope="session")
def task(synth_taskset) -> Task:
    ts = TaskSet.open(synth_taskset)
    rows = ts.rows()
    # prefer a task whose F2P tests live in their own (removed) file, with several F2P tests
    rows.sort(key=lambda r: -len(r["FAIL_TO_PASS"]))
    return Task(ts, rows[0])
