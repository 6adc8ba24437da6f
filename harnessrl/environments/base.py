"""The environment interface: what a task is, what the harness sees, and what a finished rollout earns.

A task row names its environment (`"environment"`, default `swe`); every stage that touches tasks —
estimate-difficulty, select, generate, verify, evaluate, sft, the RL loop — goes through it:

- `check_task(row)`: is the row a task of this environment (a ValueError naming the field and the fix);
- `episode(row)`: what the harness is given — the prompt, whether the task's repository is materialized as
  the agent's workspace (its tools then act on it, inside the sandbox), and the spec the rollout runs under
  when the run gives none;
- `reward(row, finished, grading)`: the reward of a finished rollout — a `Reward` (the total, its named
  parts, a status, a detail) under the reward the sample's spec names (`reward_names`, the first is the
  default; a spec may also name `module:function`, see registry.py). Reward code runs here, outside the
  agent's sandbox; anything the agent produced that must be executed runs inside a sandbox (`grading`
  holds the sandbox settings of the verify stage).

A reward that cannot be computed (an import that fails, a function that raises or returns a non-number, a
sandbox that broke) is `RewardStatus.INFRA_ERROR`: the rollout is never trained as a 0 the agent earned.

Two optional hooks, for environments whose episodes need more than a prompt (the stages check for them with
isinstance, so an environment without them works as before):

- `WorkspaceHooks` (episodes with `workspace=True`): how the agent's workspace is made, which Python the
  bubblewrap sandbox runs in it, and what the agent produced in it (`Finished.patch`). Without them the
  workspace is the task's repository from the task set and the product its diff (swe's own implementation,
  `environments.swe.TaskRepoWorkspace`).
- `HostTools` (episodes with `workspace=False`): tools that run on the host against read-only data the
  environment owns (search: a BM25 index); the agent's tool calls are requests to that data, never code, so
  no sandbox is needed. The `react` harness may then run such a task with those tools.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harnessrl.harness.runtime import ToolRuntime
    from harnessrl.sandbox.backends import SandboxChoice
    from harnessrl.sandbox.base import Limits
    from harnessrl.schema import HarnessSpec
    from harnessrl.taskset import TaskSet


class RewardStatus(StrEnum):
    SCORED = "scored"  # `total` is what the rollout earned
    INFRA_ERROR = "infra_error"  # no reward could be computed, and not because of the agent


@dataclass(frozen=True)
class Reward:
    total: float | None
    parts: Mapping[str, float] = field(default_factory=dict)  # named components (partial credit)
    status: RewardStatus = RewardStatus.SCORED
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status is RewardStatus.SCORED and not _finite(self.total):
            raise ValueError(f"a scored reward needs a finite number, got {self.total!r}")

    @classmethod
    def failed(cls, detail: str) -> Reward:
        return cls(None, status=RewardStatus.INFRA_ERROR, detail=detail[:2000])


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Episode:
    """What the harness sees for one task."""

    prompt: str
    workspace: bool  # a workspace for the agent (its tools act on it in the sandbox): WorkspaceHooks
    default_spec: HarnessSpec  # the spec a rollout runs under when the run gives none
    # keep up to this many distinct snapshots of what the agent produced, taken after each of its tool calls
    # (Finished.snapshots; 0: only the final product). Cheap products only (a file read, not a diff).
    snapshots: int = 0


@dataclass(frozen=True)
class Finished:
    """What a reward reads of a finished rollout."""

    answer: str  # the agent's final reply ("" when it gave none)
    patch: (
        str  # what the agent produced in its workspace (WorkspaceHooks.produced; swe: the diff; "" without)
    )
    rollout: Mapping[str, Any]  # the whole rollout row (ids, status, counters), for custom rewards
    snapshots: tuple[str, ...] = ()  # earlier distinct products, oldest first (Episode.snapshots)


@dataclass(frozen=True)
class Grading:
    """Where rewards that execute the agent's work run (the verify stage's settings)."""

    taskset: TaskSet
    timeout_s: float
    limits: Limits | None
    sandbox: SandboxChoice


@runtime_checkable
class Environment(Protocol):
    name: str
    reward_names: tuple[str, ...]  # the rewards a spec may name here; the first is the default

    def check_task(self, row: Mapping[str, Any]) -> None: ...

    def episode(self, row: Mapping[str, Any]) -> Episode: ...

    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward: ...


@runtime_checkable
class WorkspaceHooks(Protocol):
    """How an environment's workspace is made and read (optional; see the module docstring)."""

    def prepare(self, row: Mapping[str, Any], dest: Path, taskset: TaskSet, strict: bool) -> None:
        """Creates the agent's workspace at `dest` (`strict`: sandbox bubblewrap-strict, no .git wanted)."""
        ...

    def sandbox_env(self, row: Mapping[str, Any], taskset: TaskSet) -> Path:
        """The Python environment (a venv directory) the bubblewrap sandbox runs the agent's commands with."""
        ...

    def produced(self, row: Mapping[str, Any], workspace: Path, taskset: TaskSet) -> str:
        """What the agent produced (what the reward grades); sandbox.workspace.PatchTooLarge when it is over
        the cap (the rollout is then `patch_too_large`, scored 0)."""
        ...


@runtime_checkable
class HostTools(Protocol):
    """Tools run on the host against read-only data of the environment (optional; see the module docstring)."""

    host_tools: tuple[str, ...]  # the tool names (harness/tools.py) its runtime serves

    def host_runtime(self, row: Mapping[str, Any], taskset: TaskSet) -> ToolRuntime:
        """The runtime the harness's tools call for this task (no workspace, no sandbox, no agent code)."""
        ...
