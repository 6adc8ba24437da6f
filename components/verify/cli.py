"""`harnessrl verify ...` (one task, one patch or workspace) and `harnessrl stage verify ...` (a whole run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from components.flags import add_out, add_tasks
from harnessrl.schema import SandboxKind

if TYPE_CHECKING:
    from harnessrl.taskset import TaskSet


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout", type=float, default=300.0, help="wall-clock seconds for the test run (default 300)"
    )
    p.add_argument("--memory-mb", type=int, default=2048, help="memory limit of the test run (default 2048)")
    p.add_argument("--processes", type=int, default=256, help="process limit of the test run (default 256)")
    p.add_argument(
        "--sandbox",
        type=SandboxKind,
        choices=[k for k in SandboxKind if k is not SandboxKind.LOCAL],
        default=SandboxKind.BUBBLEWRAP,
        help="backend of the test run: podman / kubernetes run a fresh container / pod of the task's "
        "image_name (default bubblewrap)",
    )
    p.add_argument("--network", help="podman / kubernetes: named egress allow-list (default: no network)")


def register(commands, stages) -> None:
    v = commands.add_parser(
        "verify", help="grade one patch or workspace against a task (prints a JSON report)"
    )
    add_tasks(v, help="task-set directory", path=True)
    v.add_argument("--instance", required=True, help="instance_id of the task")
    src = v.add_mutually_exclusive_group(required=True)
    src.add_argument("--patch", type=Path, help="a diff file, applied to a fresh copy of the task tip")
    src.add_argument("--workspace", type=Path, help="a final workspace directory (diffed by the framework)")
    _limit_args(v)
    v.set_defaults(func=_verify_one)

    s = stages.add_parser("verify", help="grade every rollout: rewards.jsonl, logs, summary, report")
    add_tasks(s, help="task-set directory", path=True)
    s.add_argument(
        "--rollouts",
        required=True,
        type=Path,
        help="rollouts JSONL (or a directory with rollouts.jsonl): rollout_id, instance_id, "
        "workspace | model_patch | patch",
    )
    add_out(s, "replaced", path=True)
    s.add_argument("--workers", type=int, default=2, help="parallel verifications (default 2)")
    _limit_args(s)
    s.set_defaults(func=_stage)


def _sandbox(args: argparse.Namespace):
    from harnessrl.sandbox.backends import SandboxChoice

    return SandboxChoice(args.sandbox, args.network)


def _limits(args: argparse.Namespace):
    from harnessrl.sandbox.base import Limits

    return Limits(memory_mb=args.memory_mb, processes=args.processes)


def _verify_one(args: argparse.Namespace) -> int:
    from harnessrl.cli import UserError
    from harnessrl.sandbox.workspace import WorkspaceError
    from harnessrl.taskset import TaskSet
    from harnessrl.verify.verifier import verify_patch, verify_workspace

    taskset = TaskSet.open(args.tasks)
    row = taskset.row(args.instance)
    patch: Path | None = args.patch
    workspace: Path | None = args.workspace  # argparse: exactly one of the two is given
    if patch is not None and not patch.is_file():
        raise UserError(f"--patch {patch}: no such file")
    if workspace is not None and not workspace.is_dir():
        raise UserError(f"--workspace {workspace}: not a directory")
    _check_task_repo(taskset, row)
    run = {"timeout_s": args.timeout, "limits": _limits(args), "sandbox": _sandbox(args)}
    try:
        if patch is not None:
            result = verify_patch(taskset, row, patch.read_text(errors="surrogateescape"), **run)
        else:
            assert workspace is not None
            result = verify_workspace(taskset, row, workspace, **run)
    except WorkspaceError as e:  # the task's repository is broken in a way the check above did not see
        raise UserError(" ".join(str(e).split())) from None
    json.dump(result.to_dict(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    if result.infra_error:
        print(f"harnessrl: verify: infrastructure error: {result.detail}", file=sys.stderr)
        return 1
    return 0


def _field_ok(row: dict, key: str) -> bool:
    """`repo` is a non-empty string; the test lists are lists or JSON strings of lists (SWE-bench rows)."""
    value = row.get(key)
    if key == "repo":
        return isinstance(value, str) and bool(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return False
    return isinstance(value, list)


def _check_task_repo(taskset: TaskSet, row: dict) -> None:
    """The task's bundle and its branches exist: otherwise one line naming the file or branch and the fix."""
    from harnessrl.cli import UserError
    from harnessrl.sandbox.workspace import RepoCache, WorkspaceError

    iid, repo = row["instance_id"], row.get("repo")
    for key in ("repo", "FAIL_TO_PASS", "PASS_TO_PASS"):
        if not _field_ok(row, key):
            raise UserError(
                f"{taskset.tasks_path}: task {iid!r}: field {key!r} is missing or malformed "
                f"({str(row.get(key))[:60]!r}); fix the row or drop it with `harnessrl stage clean`"
            )
    assert isinstance(repo, str)
    bundle = taskset.bundle(repo)
    if not bundle.is_file():
        raise UserError(
            f"{bundle}: no bundle for repo {repo!r} (task {iid!r}); the task set {taskset.root} is incomplete: "
            "copy the bundle there or rebuild the set with `harnessrl tasks import` / `harnessrl tasks synthesize`"
        )
    try:
        cache = RepoCache.for_repo(taskset, repo)
    except WorkspaceError as e:
        raise UserError(
            f"{bundle}: cannot unpack the bundle ({' '.join(str(e).split())[:300]}); replace it or rebuild "
            "the task set with `harnessrl tasks import` / `harnessrl tasks synthesize`"
        ) from None
    from harnessrl.taskset import TaskLayout, task_layout

    revs = [(iid, "task tip"), (f"{iid}~1", "bug commit")]
    for rev, what in revs[:1] if task_layout(row) is TaskLayout.SWEBENCH else revs:  # tests: in test_patch
        try:
            cache.rev(f"refs/heads/{rev}")
        except WorkspaceError:
            raise UserError(
                f"{bundle}: no branch {iid!r} ({what} 'refs/heads/{rev}' not found); each task needs its own "
                "branch (SWE-smith layout: main + 'Bug Patch' + 'Remove F2P Tests'): rebuild the task set "
                "with `harnessrl tasks import`, or drop the row with `harnessrl stage clean`"
            ) from None


def _stage(args: argparse.Namespace) -> int:
    from harnessrl.verify.rollouts import run_verify

    summary = run_verify(
        args.tasks,
        args.rollouts,
        args.out,
        args.workers,
        timeout_s=args.timeout,
        limits=_limits(args),
        sandbox=_sandbox(args),
    )
    print(json.dumps(summary, sort_keys=True))
    return 0
