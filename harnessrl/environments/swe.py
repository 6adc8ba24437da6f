"""The `swe` environment: a SWE-smith / SWE-bench task (harnessrl.taskset). The agent works on the task's
repository (a fresh single-commit workspace, inside the sandbox, through the harness's tools); its diff is
graded by the verify machinery — applied to a fresh tree with the tests restored, the task's tests run in a
new sandbox, SWE-bench's rules (harnessrl.verify). Rewards: `swebench` (1 when resolved; the default) and
`f2p_fraction` (the share of FAIL_TO_PASS tests that pass).

`TaskRepoWorkspace` is the workspace of a task from a task set's repository (a fresh single-commit tree of
the task's branch, the per-repo venv, the framework's diff against the task tip): swe's own, and the one any
environment with a workspace gets unless it brings its own hooks (environments.base.WorkspaceHooks)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.schema import HarnessSpec, RewardName

if TYPE_CHECKING:
    from harnessrl.taskset import TaskSet

REQUIRED = ("instance_id", "repo", "problem_statement")


class TaskRepoWorkspace:
    """The workspace hooks of a task whose repository is in the task set (environments.base.WorkspaceHooks)."""

    def prepare(self, row: Mapping[str, Any], dest: Path, taskset: TaskSet, strict: bool) -> None:
        from harnessrl.sandbox.workspace import materialize

        materialize(taskset, str(row["instance_id"]), dest, strict=strict)

    def sandbox_env(self, row: Mapping[str, Any], taskset: TaskSet) -> Path:
        from harnessrl.sandbox.envs import ensure_env

        return ensure_env(taskset, str(row["repo"]))

    def produced(self, row: Mapping[str, Any], workspace: Path, taskset: TaskSet) -> str:
        """The diff of the final workspace against the task tip (PatchTooLarge over the cap)."""
        from harnessrl.sandbox.workspace import MAX_PATCH_BYTES, RepoCache

        cache = RepoCache.for_repo(taskset, str(row["repo"]))
        patch = cache.diff_worktree(
            cache.task_tip(str(row["instance_id"])), workspace, max_bytes=MAX_PATCH_BYTES
        )
        return patch.decode("utf-8", errors="replace")


class SweEnvironment(TaskRepoWorkspace, Environment):
    name: str = "swe"
    reward_names: tuple[str, ...] = (RewardName.SWEBENCH.value, RewardName.F2P_FRACTION.value)

    def check_task(self, row: Mapping[str, Any]) -> None:
        missing = [k for k in REQUIRED if not isinstance(row.get(k), str) or not row[k]]
        if missing:
            raise ValueError(
                f"task {row.get('instance_id')!r}: a swe task needs {', '.join(missing)} (a SWE-smith row; "
                "`harnessrl tasks import` / `tasks synthesize` write them)"
            )

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return Episode(prompt=str(row["problem_statement"]), workspace=True, default_spec=HarnessSpec())

    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward:
        from harnessrl.verify.grading import GRADED
        from harnessrl.verify.verifier import apply_reward, verify_diff

        result = verify_diff(
            grading.taskset,
            dict(row),
            finished.patch,
            timeout_s=grading.timeout_s,
            limits=grading.limits,
            sandbox=grading.sandbox,
        )
        result = apply_reward(result, RewardName(reward))
        if result.status not in GRADED or result.reward is None:
            return Reward.failed(f"{result.status}: {result.detail}")
        parts = {"resolved": float(result.resolved)}
        if result.f2p_fraction is not None:
            parts["f2p_fraction"] = result.f2p_fraction
        return Reward(result.reward, parts, detail=str(result.status))
