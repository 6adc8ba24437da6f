"""How much a workspace holds, and how much it may grow.

    measure(root, stop_at=None, owner=None) -> Usage(bytes, files, too_deep)
    Quota.growth(baseline: Usage, limits: Limits) -> Quota;  quota.violation(usage) -> str ("" when within)

A file counts with the larger of its size and its allocated blocks (a sparse file still costs a diff its full
length). The walk goes by directory file descriptors and never follows a symlink, so neither a path longer
than PATH_MAX nor a symlink swapped in mid-walk hides bytes or leads it outside the workspace; nesting deeper
than MAX_DEPTH is itself a violation. The same walk can hand every entry to the sandbox's host uid (`owner`),
which is how files the harness wrote as root stay editable by the agent.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harnessrl.sandbox.base import Limits

MAX_DEPTH = 128  # no real repository nests this deep; deeper trees also defeat git and most tools


@dataclass(frozen=True)
class Usage:
    bytes: int = 0
    files: int = 0  # every directory entry below the root (files, dirs, links, fifos)
    too_deep: bool = False

    def describe(self) -> str:
        return f"{self.bytes / (1 << 20):.1f} MB in {self.files} entries"


@dataclass(frozen=True)
class Quota:
    max_bytes: int
    max_files: int

    @classmethod
    def growth(cls, baseline: Usage, limits: Limits) -> Quota:
        """The workspace may grow by `limits.workspace_mb` and `limits.workspace_files` over `baseline`."""
        return cls(baseline.bytes + (limits.workspace_mb << 20), baseline.files + limits.workspace_files)

    def relaxed_to(self, usage: Usage) -> Quota:
        """Never below what is already there: a command that only deletes must be able to run."""
        return Quota(max(self.max_bytes, usage.bytes), max(self.max_files, usage.files))

    def violation(self, usage: Usage) -> str:
        if usage.too_deep:
            return f"workspace quota: directories nested deeper than {MAX_DEPTH} levels"
        if usage.bytes > self.max_bytes:
            return (
                f"workspace quota: {usage.bytes / (1 << 20):.1f} MB > {self.max_bytes / (1 << 20):.1f} MB "
                "allowed; delete files to continue"
            )
        if usage.files > self.max_files:
            return (
                f"workspace quota: {usage.files} files > {self.max_files} allowed; delete files to continue"
            )
        return ""

    def room(self, usage: Usage) -> int:
        return max(0, self.max_bytes - usage.bytes)


def _cost(st: os.stat_result) -> int:
    return max(st.st_size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else st.st_blocks * 512


def measure(
    root: os.PathLike[str] | str, stop_at: Quota | None = None, owner: tuple[int, int] | None = None
) -> Usage:
    """Walks `root`; stops early once `stop_at` is exceeded. With `owner=(uid, gid)` every entry not already
    theirs is lchown'ed to them (only while nothing runs in the sandbox: the walk itself does not race)."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return Usage()
    walk = _Walk(stop_at, owner)
    try:
        if owner is not None:
            _own(top, None, os.fstat(top), owner)
        walk.directory(top, 1)
    finally:
        os.close(top)
    return Usage(walk.bytes, walk.files, walk.too_deep)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class _Walk:
    def __init__(self, stop_at: Quota | None, owner: tuple[int, int] | None):
        self.stop_at, self.owner = stop_at, owner
        self.bytes = self.files = 0
        self.too_deep = False

    def directory(self, fd: int, depth: int) -> bool:
        """False once the walk should stop (limit exceeded)."""
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                self.files += 1
                self.bytes += _cost(st)
                if self.owner is not None:
                    _own(fd, entry.name, st, self.owner)
                stop = self.stop_at
                if stop is not None and (self.bytes > stop.max_bytes or self.files > stop.max_files):
                    return False
                if not stat.S_ISDIR(st.st_mode):
                    continue
                if depth >= MAX_DEPTH:
                    self.too_deep = True
                    return False
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    if not self.directory(child, depth + 1):
                        return False
                finally:
                    os.close(child)
        return True


def _own(dir_fd: int, name: str | None, st: os.stat_result, owner: tuple[int, int]) -> None:
    if (st.st_uid, st.st_gid) == owner:
        return
    with contextlib.suppress(OSError):
        if name is None:
            os.fchown(dir_fd, *owner)
        else:
            os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


POLL_S = 0.1  # how often a running command's workspace is measured (at least 20x a walk's duration)


def wait_watching(proc: subprocess.Popen[bytes], timeout: float, workspace: Path, allowed: Quota) -> str:
    """Waits for a sandboxed command while measuring its workspace: "" when it ended, "timeout", or the
    quota it broke (the caller then kills it). A walk that gets slow is done less often."""
    deadline = time.monotonic() + timeout
    poll = POLL_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        try:
            proc.wait(timeout=min(poll, remaining))
            return ""
        except subprocess.TimeoutExpired:
            pass
        t0 = time.monotonic()
        violation = allowed.violation(measure(workspace, stop_at=allowed))
        if violation:
            return violation
        poll = max(POLL_S, 20 * (time.monotonic() - t0))
