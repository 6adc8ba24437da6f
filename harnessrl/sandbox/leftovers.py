"""Temp dirs and cgroups that name the process that made them, so a later run can sweep what a killed one left.

A name carries an owner tag `<pid>.<start time>.<pid namespace>`; the owner is gone when no process with that
pid and start time exists in our pid namespace. `sweep()` removes only leftovers whose owner is gone, that
belong to this user and that were made in this pid namespace (a tag from another namespace cannot be judged
and is left alone). It runs once per process, when the first sandbox is created.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

_TAG = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_TEMP_NAME = re.compile(rf"^harnessrl-[a-z]+-{_TAG.pattern}-")


def _start_time(pid: int) -> int | None:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat_line.rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks since boot


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


_tags: dict[int, str] = {}


def current_tag() -> str:
    """This process's owner tag (a forked child gets its own: the pid is part of it)."""
    pid = os.getpid()
    if pid not in _tags:
        _tags[pid] = f"{pid}.{_start_time(pid)}.{_pid_namespace()}"
    return _tags[pid]


def owner_gone(tag_match: re.Match[str] | tuple[str, str, str]) -> bool:
    """True only when the owner is certainly dead: same pid namespace, and that pid is free or reused."""
    pid, start, ns = tag_match.groups() if isinstance(tag_match, re.Match) else tag_match
    if int(ns) != _pid_namespace():
        return False
    return _start_time(int(pid)) != int(start)


def make_tempdir(kind: str, parent: Path | None = None) -> Path:
    """`<tmp>/harnessrl-<kind>-<owner tag>-XXXXXXXX`, mode 0700."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"temp dir kind must be lowercase letters, got {kind!r}")
    return Path(tempfile.mkdtemp(prefix=f"harnessrl-{kind}-{current_tag()}-", dir=parent))


def temp_prefix(kind: str) -> str:
    """A prefix for `tempfile` functions that makes the dir sweepable (e.g. TemporaryDirectory(prefix=...))."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"temp dir kind must be lowercase letters, got {kind!r}")
    return f"harnessrl-{kind}-{current_tag()}-"


def remove_tree(path: Path) -> None:
    """rmtree that also gets through directories a sandboxed command made unwritable (chmod 000)."""

    def fix(func: Callable[..., object], p: str, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):
            return
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
        with contextlib.suppress(OSError):
            if func in (os.rmdir, os.unlink):
                func(p)
            else:
                shutil.rmtree(p, ignore_errors=True)

    # 3.11's rmtree has only `onerror` (exc_info tuple); it still exists, deprecated, in later versions
    shutil.rmtree(path, onerror=lambda func, p, exc_info: fix(func, p, exc_info[1]))


def stale_temp_dirs(root: Path | None = None) -> list[Path]:
    root = Path(root or tempfile.gettempdir())
    out = []
    me = os.geteuid()
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            m = _TEMP_NAME.match(entry.name)
            if m is None:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == me and owner_gone(m):
                    out.append(Path(entry.path))
    return out


_swept = False
_sweep_lock = threading.Lock()


def sweep(extra: Iterable[Callable[[], int]] = ()) -> int:
    """Removes stale temp dirs (and whatever `extra` sweepers remove); returns how many things went."""
    removed = 0
    for d in stale_temp_dirs():
        remove_tree(d)
        if not d.exists():
            removed += 1
            logger.info("removed %s, left by a harnessrl process that no longer runs", d)
    for sweeper in extra:
        removed += sweeper()
    return removed


def sweep_once(extra: Iterable[Callable[[], int]] = ()) -> None:
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    try:
        sweep(extra)
    except Exception:  # never let cleanup of old runs break this one
        logger.warning("sweeping leftovers of earlier runs failed", exc_info=True)
