"""Task workspaces: what the agent gets, and the git plumbing the verifier uses.

    materialize(taskset: TaskSet, instance_id: str, dest: Path, strict: bool = False) -> Path

The agent's workspace is the tip of branch `<instance_id>` (bug present, F2P tests removed) exported into a
**new** repository with exactly one commit ("Initial commit"), no remotes, no other branches, no reflog, no
hooks, so `git log`, `git show HEAD~1` or `git log --all` reveal nothing. SWE-smith keeps the bug patch in the
branch's parent commits, which is why the task's own repository never enters a sandbox. `strict=True` leaves
no `.git` at all (the bubblewrap sandbox then puts a `git` in PATH that refuses).

Each task set's bundles are unpacked once into a bare mirror under the cache
(`$HARNESSRL_CACHE` or `~/.cache/harnessrl`, `repos/<repo>-<bundle sha>.git`), shared by all workspaces.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from harnessrl.io import atomic_output
from harnessrl.sandbox import leftovers
from harnessrl.taskset import TaskSet

FIXED_DATE = "2000-01-01T00:00:00+0000"  # the workspace commit carries no real date or author


class WorkspaceError(RuntimeError):
    """The task's repository is missing or malformed (infrastructure / data, never the agent)."""


class PatchTooLarge(Exception):
    """The agent's changes make a diff over the cap: the agent's doing, not an infrastructure failure."""

    def __init__(self, limit: int):
        super().__init__(f"the workspace diff exceeds {limit} bytes (MAX_PATCH_BYTES); it was not kept")
        self.limit = limit


MAX_PATCH_BYTES = 8 << 20  # a real fix is kilobytes; a bigger diff would bloat every row and log it enters


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_name(key: str) -> str:
    """A file or directory name for an id that comes from task data (rollout ids hold instance ids): the id
    itself when it is a plain name, else its plain characters plus a hash of the whole id. `+` never occurs
    in a plain name, so distinct ids keep distinct names; no result contains `/` or starts with `.`."""
    if _PLAIN_NAME.fullmatch(key):
        return key
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:80].lstrip(".")
    return f"{plain}+{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}"


def cache_root() -> Path:
    return Path(os.environ.get("HARNESSRL_CACHE", Path.home() / ".cache" / "harnessrl"))


def git_env(**extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "GIT_AUTHOR_NAME": "harnessrl",
        "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
        "GIT_COMMITTER_NAME": "harnessrl",
        "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_DATE": FIXED_DATE,
    }
    env.update(extra)
    return env


# Never run anything the inspected tree or repo could configure (hooks, fsmonitor, external diff drivers).
SAFE_GIT = [
    "git",
    "-c",
    "safe.directory=*",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "diff.noprefix=false",
]


def git(
    args: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([*SAFE_GIT, *args], cwd=cwd, env=env or git_env(), input=input, capture_output=True)
    if check and proc.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc


_known: dict[tuple, RepoCache] = {}  # bundle (path, size, mtime, cache root) -> its mirror, per process
_known_lock = threading.Lock()


@dataclass(frozen=True)
class RepoCache:
    """A bare mirror of one task-set bundle."""

    path: Path

    @classmethod
    def for_repo(cls, taskset: TaskSet, repo: str) -> RepoCache:
        bundle = taskset.bundle(repo)
        if not bundle.is_file():
            raise WorkspaceError(
                f"{bundle}: bundle for repo {repo!r} missing from the task set {taskset.root}"
            )
        st = bundle.stat()
        key = (str(bundle.resolve()), st.st_size, st.st_mtime_ns, str(cache_root()))
        with _known_lock:
            known = _known.get(key)
        if known is not None and (known.path / "HEAD").is_file():
            return known
        cache = cls._unpack(bundle, repo)
        with _known_lock:
            _known[key] = cache
        return cache

    @classmethod
    def _unpack(cls, bundle: Path, repo: str) -> RepoCache:
        digest = hashlib.sha256()
        with open(bundle, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        path = cache_root() / "repos" / f"{repo.replace('/', '__')}-{digest.hexdigest()[:16]}.git"
        if not (path / "HEAD").is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
            try:
                git(["clone", "-q", "--mirror", str(bundle), str(tmp / "repo.git")])
                try:
                    os.rename(tmp / "repo.git", path)
                except OSError:
                    if not (path / "HEAD").is_file():  # lost a race only if the winner finished
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return cls(path)

    def rev(self, rev: str) -> str:
        proc = git(
            ["--git-dir", str(self.path), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], check=False
        )
        if proc.returncode != 0:
            raise WorkspaceError(f"{self.path}: revision {rev!r} not found")
        return proc.stdout.decode().strip()

    def task_tip(self, instance_id: str) -> str:
        """The agent's starting point: bug present, F2P tests removed."""
        try:
            return self.rev(f"refs/heads/{instance_id}")
        except WorkspaceError:
            raise WorkspaceError(
                f"{self.path}: no branch {instance_id!r}; the bundle must hold one branch per task "
                "(SWE-smith layout)"
            ) from None

    def bug_commit(self, instance_id: str) -> str:
        """The "Bug Patch" commit (tip~1): the tree the tests are run against, with tests present."""
        return self.rev(f"refs/heads/{instance_id}~1")

    def export(self, rev: str, dest: Path) -> None:
        """Writes the tree of `rev` into `dest` (files only; no repository)."""
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("idx")) as tmp:
            env = git_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
            git(["--git-dir", str(self.path), "read-tree", rev], env=env)
            git(
                ["--git-dir", str(self.path), "--work-tree", str(dest), "checkout-index", "-a", "-f"], env=env
            )

    def restore_paths(self, rev: str, worktree: Path, paths: list[str]) -> list[str]:
        """Overwrites `paths` in `worktree` with their content at `rev`; returns those that do not exist there."""
        missing = []
        with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("idx")) as tmp:
            env = git_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
            git(["--git-dir", str(self.path), "read-tree", rev], env=env)
            for p in paths:
                target = worktree / p
                if target.is_symlink() or target.is_file():
                    target.unlink()
                elif target.is_dir():
                    shutil.rmtree(target)
                proc = git(
                    [
                        "--git-dir",
                        str(self.path),
                        "--work-tree",
                        str(worktree),
                        "checkout-index",
                        "-f",
                        "--",
                        p,
                    ],
                    env=env,
                    check=False,
                )
                if proc.returncode != 0:
                    missing.append(p)
        return missing

    def diff_worktree(self, rev: str, worktree: Path, max_bytes: int | None = None) -> bytes:
        """Binary diff from `rev` to the files in `worktree` (new, deleted and binary files included).

        Uses a throwaway index and object directory, never the worktree's own `.git`, so nothing the agent
        did to its repository (rewritten HEAD, staged tricks, hooks) matters. With `max_bytes`, the diff is
        read as git writes it and PatchTooLarge is raised as soon as it grows past the cap.
        """
        with tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("diff")) as tmp:
            objects = Path(tmp) / "objects"
            objects.mkdir()
            env = git_env(
                GIT_INDEX_FILE=str(Path(tmp) / "index"),
                GIT_OBJECT_DIRECTORY=str(objects),
                GIT_ALTERNATE_OBJECT_DIRECTORIES=str(self.path / "objects"),
            )
            base = ["--git-dir", str(self.path), "--work-tree", str(worktree)]
            git([*base, "read-tree", rev], env=env)
            git([*base, "add", "-A", "--", "."], env=env)
            diff = [
                *base,
                "diff",
                "--cached",
                "--binary",
                "--full-index",
                "--no-renames",
                "--no-ext-diff",
                "--no-textconv",
                rev,
            ]
            if max_bytes is None:
                return git(diff, env=env).stdout
            return _capped_git_output(diff, env, max_bytes)


def _capped_git_output(args: list[str], env: dict[str, str], max_bytes: int) -> bytes:
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*SAFE_GIT, *args], env=env, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        chunks, size = [], 0
        try:
            while chunk := proc.stdout.read(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise PatchTooLarge(max_bytes)
                chunks.append(chunk)
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            raise WorkspaceError(
                f"git {' '.join(args[:3])} failed: {err.read().decode(errors='replace').strip()}"
            )
    return b"".join(chunks)


def init_single_commit(tree_dir: Path) -> None:
    """Turns a directory of files into a repository with exactly one commit on `main` and nothing else."""
    git(["init", "-q", "--template=", "-b", "main", str(tree_dir)])
    g = ["-C", str(tree_dir)]
    git([*g, "config", "core.logAllRefUpdates", "false"])
    git([*g, "config", "user.name", "agent"])
    git([*g, "config", "user.email", "agent@localhost"])
    git([*g, "add", "-A", "-f", "--", "."])
    git([*g, "commit", "-q", "--no-verify", "-m", "Initial commit"])
    shutil.rmtree(tree_dir / ".git" / "logs", ignore_errors=True)


def materialize(taskset: TaskSet, instance_id: str, dest: Path, strict: bool = False) -> Path:
    """Creates (or replaces) the agent's workspace for `instance_id` at `dest`; returns `dest`."""
    row = taskset.row(instance_id)
    cache = RepoCache.for_repo(taskset, row["repo"])
    tip = cache.task_tip(instance_id)
    dest = Path(dest)
    with atomic_output(dest) as tmp:
        cache.export(tip, tmp)
        if not strict:
            init_single_commit(tmp)
    return dest
