"""Workspaces and per-repo envs on a task set synthesized from a real repo (tests/fixtures/minirepo)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from harnessrl.sandbox.base import Outcome
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.sandbox.envs import ensure_env
from harnessrl.sandbox.workspace import (
    MAX_PATCH_BYTES,
    PatchTooLarge,
    RepoCache,
    WorkspaceError,
    materialize,
    safe_name,
)
from harnessrl.taskset import TaskSet
from tests.support.fixtures import requires_bwrap


@pytest.fixture(scope="module")
def ts(synth_taskset) -> TaskSet:
    return TaskSet.open(synth_taskset)


def _git(ws, *args) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True, check=True).stdout


def test_workspace_is_a_fresh_single_commit_of_the_task_tip(ts, tmp_path):
    row = ts.rows()[0]
    ws = materialize(ts, row["instance_id"], tmp_path / "ws")
    cache = RepoCache.for_repo(ts, row["repo"])
    tip = cache.task_tip(row["instance_id"])
    tip_tree = subprocess.run(
        ["git", "--git-dir", str(cache.path), "rev-parse", f"{tip}^{{tree}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert _git(ws, "rev-parse", "HEAD^{tree}") == tip_tree  # exactly the tip's files
    assert len(_git(ws, "rev-list", "--all").split()) == 1
    assert _git(ws, "branch", "-a").split() == ["*", "main"]
    assert _git(ws, "remote").strip() == "" and _git(ws, "tag").strip() == ""
    assert not (ws / ".git" / "logs").exists() and not (ws / ".git" / "packed-refs").exists()
    assert list((ws / ".git").glob("hooks/*")) == []
    assert _git(ws, "status", "--porcelain").strip() == ""
    assert (
        _git(ws, "log", "-1", "--format=%s %an %ad", "--date=unix") == "Initial commit harnessrl 946684800\n"
    )
    # the F2P tests are absent, the bug is present
    for test_id in row["FAIL_TO_PASS"]:
        path, name = test_id.split("::")
        assert not (ws / path).exists() or f"def {name.split('[')[0]}(" not in (ws / path).read_text()
    bug_line = next(
        ln[1:] for ln in row["patch"].splitlines() if ln.startswith("+") and not ln.startswith("+++")
    )
    assert any(bug_line in p.read_text() for p in ws.rglob("*.py"))


def test_rerun_replaces_and_strict_has_no_git(ts, tmp_path):
    iid = ts.rows()[0]["instance_id"]
    ws = materialize(ts, iid, tmp_path / "ws")
    (ws / "junk.txt").write_text("x")
    materialize(ts, iid, tmp_path / "ws")
    assert not (ws / "junk.txt").exists()
    strict = materialize(ts, iid, tmp_path / "strict", strict=True)
    assert not (strict / ".git").exists()
    assert sorted(p.name for p in strict.iterdir()) == sorted(
        p.name for p in ws.iterdir() if p.name != ".git"
    )


def test_unknown_instance_and_missing_bundle_are_clear_errors(ts, tmp_path):
    with pytest.raises(KeyError, match="no task with instance_id 'nope'"):
        materialize(ts, "nope", tmp_path / "ws")
    row = dict(ts.rows()[0], repo="other/repo")
    with pytest.raises(WorkspaceError, match="bundle for repo 'other/repo' missing"):
        RepoCache.for_repo(ts, row["repo"])
    cache = RepoCache.for_repo(ts, ts.rows()[0]["repo"])
    with pytest.raises(WorkspaceError, match="no branch 'nope'"):
        cache.task_tip("nope")


def test_diff_ignores_the_workspace_git_and_sees_new_deleted_binary_files(ts, tmp_path):
    row = ts.rows()[0]
    ws = materialize(ts, row["instance_id"], tmp_path / "ws")
    cache = RepoCache.for_repo(ts, row["repo"])
    (ws / "new_module.py").write_text("X = 1\n")
    (ws / "blob.bin").write_bytes(bytes(range(256)))
    (ws / "README.md").unlink()
    # the agent rewrites its own history: irrelevant, the framework diffs against the task tip
    subprocess.run(
        "git add -A && git -c user.name=a -c user.email=a@b commit -qm 'looks clean'",
        shell=True,
        cwd=ws,
        check=True,
    )
    diff = cache.diff_worktree(cache.task_tip(row["instance_id"]), ws).decode()
    assert "new file mode" in diff and "new_module.py" in diff
    assert "deleted file mode" in diff and "README.md" in diff
    assert "GIT binary patch" in diff
    assert ".git/" not in diff


def test_diff_over_the_cap_raises_patch_too_large_without_reading_it_all(ts, tmp_path):
    """200 MB of random files became a 258 MB model_patch: the diff is now cut off at the cap."""
    row = ts.rows()[0]
    ws = materialize(ts, row["instance_id"], tmp_path / "ws")
    cache = RepoCache.for_repo(ts, row["repo"])
    for i in range(4):
        (ws / f"noise{i}.bin").write_bytes(os.urandom(2 << 20))
    tip = cache.task_tip(row["instance_id"])
    with pytest.raises(PatchTooLarge, match="exceeds 1048576 bytes"):
        cache.diff_worktree(tip, ws, max_bytes=1 << 20)
    small = materialize(ts, row["instance_id"], tmp_path / "small")
    (small / "new_module.py").write_text("X = 1\n")
    assert cache.diff_worktree(tip, small, max_bytes=MAX_PATCH_BYTES) == cache.diff_worktree(tip, small)


@pytest.mark.parametrize(
    "key",
    ["../../etc/passwd", "..", ".", "a/b", "/abs", "x" * 300, "sp ace", "é", "", "-rf", ".hidden"],
)
def test_safe_name_never_escapes_a_directory(key, tmp_path):
    name = safe_name(key)
    assert name and "/" not in name and not name.startswith(".") and len(name.encode()) <= 255
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_safe_name_keeps_plain_ids_and_distinct_ids_distinct():
    assert safe_name("swesmith__minirepo.abc123.func_pm_op_swap__x1__r0") == (
        "swesmith__minirepo.abc123.func_pm_op_swap__x1__r0"
    )
    keys = ["a/b", "a_b", "a?b", "a b", "a+b", "a_b+", "x" * 300, "x" * 301, "..", "._"]
    assert len({safe_name(k) for k in keys}) == len(keys)
    assert safe_name("a/b") == safe_name("a/b")  # stable across calls and processes (no salt)


@requires_bwrap
def test_env_is_cached_and_serves_python_pytest_and_the_repo(ts, tmp_path):
    row = ts.rows()[0]
    env = ensure_env(ts, row["repo"])
    t0 = time.monotonic()
    assert ensure_env(ts, row["repo"]) == env and time.monotonic() - t0 < 1.0
    assert (env / ".ready").is_file()
    ws = materialize(ts, row["instance_id"], tmp_path / "ws")
    with BubblewrapSandbox(ws, env) as sb:
        r = sb.run(
            "python -c 'import pytest, minicalc; print(minicalc.__file__)' && git log --oneline | wc -l "
            "&& sed -n 1p README.md | grep -c . && touch $VIRTUAL_ENV/x",
            timeout=60,
        )
    assert r.outcome is Outcome.NONZERO, r.stderr
    assert r.stdout.split()[:3] == ["/workspace/minicalc/__init__.py", "1", "1"]
    assert "Read-only file system" in r.stderr
