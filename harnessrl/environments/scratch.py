"""The workspace an answer-graded task gives a harness that needs one (rollout.fit.Room.SCRATCH_WORKSPACE).

Instruction, search and procedural tasks are graded on the agent's final answer, not on files; a harness that
works in a workspace (react with bash/edit, mini-swe-agent) or runs whole inside its sandbox (Claude Code,
Codex) still gets one: the task statement as `TASK.md` and nothing else, in the spec's sandbox, whose Python is
the standard library only (sandbox.envs.bare_env). What the agent leaves there is not graded (`produced` is
""): its final answer is — Claude Code's `result`, Codex's last agent message, mini-swe-agent's submission,
ReAct's `answer` tool (its `submit` carries no answer: rollout.fit refuses react without `answer` here).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harnessrl.taskset import TaskSet

TASK_FILE = "TASK.md"


class ScratchWorkspace:
    """environments.base.WorkspaceHooks for a task whose environment grades an answer."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt

    def prepare(self, row: Mapping[str, Any], dest: Path, taskset: TaskSet, strict: bool) -> None:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        (dest / TASK_FILE).write_text(self.prompt + "\n")

    def sandbox_env(self, row: Mapping[str, Any], taskset: TaskSet) -> Path:
        from harnessrl.sandbox.envs import bare_env

        return bare_env()

    def produced(self, row: Mapping[str, Any], workspace: Path, taskset: TaskSet) -> str:
        return ""
