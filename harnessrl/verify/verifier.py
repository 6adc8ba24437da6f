"""Verifying one rollout: the framework's diff, filtered, applied to a fresh bug-commit tree, tested in a new sandbox.

    verify_workspace(taskset, row, workspace: Path, ...) -> VerifyResult
    verify_patch(taskset, row, patch_text: str, ...) -> VerifyResult

1. diff the workspace against the task tip with a throwaway index (the workspace's `.git` is never read);
2. drop test/config/start-up-hook changes (filtering.py) and record them;
3. export the tree the diff was taken against into a **new** tree (SWE-smith: the bug commit, "Bug Patch",
   tip~1, tests present; SWE-bench: the task tip = `base_commit`), apply the filtered diff (`git apply`, then
   `git apply --3way`, then `patch --fuzz`), then put the task's tests in (`TestSource`): the F2P+P2P test
   files restored from that commit; for a SWE-bench row also the files `test_patch` touches, then
   `test_patch` applied on top (as SWE-bench's evaluation does; the agent never saw it);
4. run only those test files in a **new** sandbox (`sandbox=`: bubblewrap with the repo's env read-only by
   default; podman / kubernetes: a fresh container / pod of the task's `image_name`), a cleared environment
   and a timeout;
5. grade with SWE-bench 5.x rules (grading.py); when the run ended abnormally (crash, pytest.exit, nothing
   collected), run the *unpatched* bug tree the same way as a witness: if it completes, the patch caused the
   crash (0); if not, the environment did (infra_error).

Statuses (`VerifyStatus`): resolved / unresolved (reward 1 / 0), timeout / resource_limit (the code under test
hung or blew its limits: reward 0), apply_failed (the agent's diff does not apply: reward 0), infra_error
(reward None: the sandbox broke, the task data is bad, or the test log is inconsistent — never trained as 0).
`apply_reward` turns a result into the reward a rollout's harness spec names (`RewardName`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.sandbox import leftovers
from harnessrl.sandbox.backends import DEFAULT_CHOICE, SandboxChoice, needs_env
from harnessrl.sandbox.base import Limits, Outcome, RunResult
from harnessrl.sandbox.envs import ensure_env
from harnessrl.sandbox.workspace import RepoCache, git, init_single_commit
from harnessrl.schema import RewardName
from harnessrl.taskset import TaskLayout, TaskSet, task_layout
from harnessrl.verify.filtering import filter_diff, split_diff, test_files_of
from harnessrl.verify.grading import PytestRun, VerifyStatus, judge, reward_for

DEFAULT_TIMEOUT_S = 300.0
MAX_LOG_CHARS = 200_000
PYTEST_ARGS = ["-rA", "-v", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir=/workspace"]
_STOPPED = {Outcome.TIMEOUT: VerifyStatus.TIMEOUT, Outcome.RESOURCE_LIMIT: VerifyStatus.RESOURCE_LIMIT}


def pytest_argv(test_files: list[str]) -> list[str]:
    """The command verify runs in the sandbox (from /workspace)."""
    return ["python", "-P", "-m", "pytest", *PYTEST_ARGS, *test_files]


def as_pytest_run(run: RunResult) -> PytestRun:
    return PytestRun(run.stdout, run.exit_code, _STOPPED.get(run.outcome))


@dataclass
class VerifyResult:
    instance_id: str
    status: VerifyStatus
    resolved: bool = False
    reward: float | None = None
    f2p_fraction: float | None = None
    tests: dict[str, dict] = field(default_factory=dict)
    dropped: list[dict] = field(default_factory=list)
    suspicious: list[dict] = field(default_factory=list)
    flagged: bool = False
    diff: str = ""  # the filtered diff that was applied
    apply_method: str = ""
    test_log: str = ""
    exit_code: int | None = None
    detail: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    reward_fn: str = RewardName.SWEBENCH  # which reward `reward` is
    reward_parts: dict[str, float] = field(default_factory=dict)  # an environment's named components

    @property
    def infra_error(self) -> bool:
        return self.status is VerifyStatus.INFRA_ERROR

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tests(row: dict, key: str) -> list[str]:
    value = row.get(key) or []
    if isinstance(value, str):  # SWE-bench rows carry JSON strings
        value = json.loads(value)
    return [str(v) for v in value]


def _printable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def apply_patch(tree: Path, patch: str) -> tuple[str, str]:
    """Applies `patch` in `tree` (a git repo); returns (method, error). method is '' when nothing applied."""
    if not patch.strip():
        return "empty", ""
    with tempfile.NamedTemporaryFile(
        "w", suffix=".diff", delete=False, encoding="utf-8", errors="surrogateescape"
    ) as f:
        f.write(patch)
        pf = f.name
    try:
        errors = []
        for method, args in (
            ("git apply", ["apply", "--whitespace=nowarn", pf]),
            ("git apply --3way", ["apply", "--3way", "--whitespace=nowarn", pf]),
        ):
            proc = git(["-C", str(tree), *args], check=False)
            if proc.returncode == 0:
                return method, ""
            errors.append(f"{method}: {proc.stderr.decode(errors='replace').strip()[:500]}")
            git(["-C", str(tree), "checkout", "-q", "-f", "HEAD", "--", "."], check=False)
            git(["-C", str(tree), "clean", "-q", "-fd"], check=False)
        if shutil.which("patch"):
            proc = subprocess.run(
                [
                    "patch",
                    "-p1",
                    "--batch",
                    "--forward",
                    "--fuzz=3",
                    "--no-backup-if-mismatch",
                    "-r",
                    "-",
                    "-i",
                    pf,
                ],
                cwd=tree,
                capture_output=True,
                text=True,
            )
            if proc.returncode == 0:
                return "patch --fuzz=3", ""
            errors.append(f"patch --fuzz=3: {(proc.stdout + proc.stderr).strip()[:500]}")
        return "", " | ".join(errors)
    finally:
        Path(pf).unlink(missing_ok=True)


def apply_reward(result: VerifyResult, name: RewardName) -> VerifyResult:
    """`result` with the reward `name` gives it (the rollout's spec decides; the verdict itself is unchanged)."""
    result.reward = reward_for(name, result.status, result.resolved, result.f2p_fraction)
    result.reward_fn = name
    return result


@dataclass(frozen=True)
class TestSource:
    """Where a task's graded tests come from: SWE-smith, the bug commit (tip~1, tests present); SWE-bench, the
    task tip (`base_commit`) with the row's `test_patch` applied at grading time only."""

    __test__ = False  # not a pytest test class

    rev: str
    test_patch: str = ""

    @classmethod
    def of(cls, cache: RepoCache, row: dict) -> TestSource:
        iid = row["instance_id"]
        if task_layout(row) is TaskLayout.SWEBENCH:
            return cls(cache.task_tip(iid), row["test_patch"])
        return cls(cache.bug_commit(iid))

    def add_tests(self, cache: RepoCache, tree: Path, test_files: list[str]) -> str:
        """Puts the tests into `tree` (the agent's changes already applied); '' or what is wrong with the task."""
        touched = [f.path for f in split_diff(self.test_patch)] if self.test_patch else []
        missing = cache.restore_paths(self.rev, tree, sorted(set(test_files) | set(touched)))
        if self.test_patch:
            proc = git(
                ["-C", str(tree), "apply", "--whitespace=nowarn", "-"],
                input=self.test_patch.encode(),
                check=False,
            )
            if proc.returncode != 0:
                return f"the task's test_patch does not apply: {proc.stderr.decode(errors='replace').strip()[:500]}"
            missing = [p for p in test_files if not (tree / p).is_file()]
        where = "after its test_patch" if self.test_patch else "at the bug commit"
        return f"task test file(s) missing {where}: {missing}" if missing else ""


_witnesses: dict[tuple, PytestRun] = {}  # one run of each unpatched tree per process (the latest few)
_witness_lock = threading.Lock()
MAX_WITNESSES = 64


def _run_tests(
    choice: SandboxChoice,
    tree: Path,
    env_dir: Path | None,
    image: str | None,
    test_files: list[str],
    timeout_s: float,
    limits: Limits | None,
) -> RunResult:
    """pytest on `tree` in a new sandbox of the chosen backend, closed afterwards."""
    with choice.make(tree, env_dir=env_dir, image=image, limits=limits or Limits()) as sandbox:
        return sandbox.run(pytest_argv(test_files), timeout=timeout_s, limits=limits)


def _witness(
    cache: RepoCache,
    src: TestSource,
    env_dir: Path | None,
    test_files: list[str],
    timeout_s: float,
    limits: Limits | None,
    choice: SandboxChoice = DEFAULT_CHOICE,
    image: str | None = None,
) -> PytestRun:
    """The same tests on the unpatched bug tree, in a new sandbox (a sandbox failure is not cached)."""
    key = (str(cache.path), src, tuple(test_files), timeout_s, limits, choice, image)
    with _witness_lock:
        known = _witnesses.get(key)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("witness")) as tmp:
        tree = Path(tmp) / "tree"
        cache.export(src.rev, tree)
        if src.add_tests(cache, tree, test_files):
            return PytestRun("", None)
        run = _run_tests(choice, tree, env_dir, image, test_files, timeout_s, limits)
    if run.outcome is Outcome.SANDBOX_ERROR:
        return PytestRun("", None)
    with _witness_lock:
        while len(_witnesses) >= MAX_WITNESSES:
            del _witnesses[next(iter(_witnesses))]
        return _witnesses.setdefault(key, as_pytest_run(run))


def verify_diff(
    taskset: TaskSet,
    row: dict,
    raw_diff: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limits: Limits | None = None,
    sandbox: SandboxChoice = DEFAULT_CHOICE,
) -> VerifyResult:
    """Steps 2-5 on a diff against the task tip computed by the framework."""
    iid = row["instance_id"]
    f2p, p2p = _tests(row, "FAIL_TO_PASS"), _tests(row, "PASS_TO_PASS")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        filtered = filter_diff(raw_diff, f2p, p2p)
    except ValueError as e:
        return VerifyResult(iid, VerifyStatus.INFRA_ERROR, detail=f"cannot parse the computed diff: {e}")
    result = VerifyResult(
        iid,
        VerifyStatus.INFRA_ERROR,
        dropped=[{**d.to_dict(), "diff": _printable(d.diff)} for d in filtered.dropped],
        suspicious=filtered.suspicious,
        flagged=filtered.flagged,
        diff=_printable(filtered.patch),
    )
    test_files = sorted(test_files_of(f2p) | test_files_of(p2p))
    if not test_files:
        result.detail = "task row has no FAIL_TO_PASS/PASS_TO_PASS tests"
        return result
    if not filtered.patch.strip():
        # Nothing of the agent's reaches the graded tree: it is the task's own unpatched state, where its
        # FAIL_TO_PASS tests fail by definition (the validate stage checked it). SWE-bench's harness does not
        # run an empty patch either; a test run would only cost a sandbox.
        result.status, result.reward, result.f2p_fraction = VerifyStatus.UNRESOLVED, 0.0, 0.0
        result.detail = "empty patch: " + (
            "the agent's only changes were dropped (see dropped)" if filtered.dropped else "no changes"
        )
        result.detail += "; scored 0 without running tests"
        result.timings = {"prepare_s": time.monotonic() - t0}
        return result
    cache = RepoCache.for_repo(taskset, row["repo"])
    env_dir = ensure_env(taskset, row["repo"]) if needs_env(sandbox.kind) else None
    image = row.get("image_name") or None
    src = TestSource.of(cache, row)
    with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("verify")) as tmp:
        tree = Path(tmp) / "tree"
        cache.export(src.rev, tree)
        init_single_commit(tree)
        method, error = apply_patch(tree, filtered.patch)
        result.apply_method = method
        timings["prepare_s"] = time.monotonic() - t0
        if not method:
            result.status, result.reward = VerifyStatus.APPLY_FAILED, 0.0
            result.detail = f"the diff does not apply: {error}"
            result.timings = timings
            return result
        problem = src.add_tests(cache, tree, test_files)
        if problem:
            result.detail = problem
            return result
        shutil.rmtree(tree / ".git", ignore_errors=True)
        t1 = time.monotonic()
        try:
            run = _run_tests(sandbox, tree, env_dir, image, test_files, timeout_s, limits)
        except ValueError as e:  # no image for a container backend: the task data, never the agent
            result.detail = f"sandbox {sandbox.kind}: {e}"
            return result
        timings["tests_s"] = time.monotonic() - t1
    log = run.stdout + ("\n--- stderr ---\n" + run.stderr if run.stderr.strip() else "")
    result.test_log = log[-MAX_LOG_CHARS:]
    result.exit_code = run.exit_code
    result.timings = timings
    if run.outcome is Outcome.SANDBOX_ERROR:
        result.detail = f"sandbox error: {run.detail}"
        return result

    def witness() -> PytestRun:
        t2 = time.monotonic()
        try:
            return _witness(cache, src, env_dir, test_files, timeout_s, limits, sandbox, image)
        finally:
            timings["witness_s"] = time.monotonic() - t2

    g = judge(f2p, p2p, as_pytest_run(run), witness)
    result.status, result.resolved, result.reward = g.status, g.resolved, g.reward
    result.tests, result.f2p_fraction = g.tests, g.f2p_fraction
    result.detail = f"tests stopped: {run.detail}" if g.status in _STOPPED.values() else g.detail
    return result


def verify_workspace(
    taskset: TaskSet,
    row: dict,
    workspace: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limits: Limits | None = None,
    sandbox: SandboxChoice = DEFAULT_CHOICE,
) -> VerifyResult:
    workspace = Path(workspace)
    if not workspace.is_dir():
        return VerifyResult(
            row["instance_id"], VerifyStatus.INFRA_ERROR, detail=f"workspace {workspace} does not exist"
        )
    cache = RepoCache.for_repo(taskset, row["repo"])
    raw = cache.diff_worktree(cache.task_tip(row["instance_id"]), workspace).decode(
        "utf-8", errors="surrogateescape"
    )
    return verify_diff(taskset, row, raw, timeout_s=timeout_s, limits=limits, sandbox=sandbox)


def verify_patch(
    taskset: TaskSet,
    row: dict,
    patch_text: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limits: Limits | None = None,
    sandbox: SandboxChoice = DEFAULT_CHOICE,
) -> VerifyResult:
    """Applies `patch_text` to a fresh copy of the task tip, then verifies that tree like a workspace."""
    cache = RepoCache.for_repo(taskset, row["repo"])
    with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("patch")) as tmp:
        ws = Path(tmp) / "ws"
        cache.export(cache.task_tip(row["instance_id"]), ws)
        init_single_commit(ws)
        method, error = apply_patch(ws, patch_text)
        if not method:
            return VerifyResult(
                row["instance_id"],
                VerifyStatus.APPLY_FAILED,
                reward=0.0,
                detail=f"the patch does not apply to the task: {error}",
            )
        shutil.rmtree(ws / ".git")
        return verify_workspace(taskset, row, ws, timeout_s=timeout_s, limits=limits, sandbox=sandbox)
