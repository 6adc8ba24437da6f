"""Per-command cgroups for exact memory and process limits, with the events that prove a limit was hit.

cgroup v2 (a writable, delegated subtree with the memory and pids controllers) is preferred; cgroup v1
(writable memory and pids hierarchies, as on many container hosts where we run as root) is used otherwise.
Groups are created *below this process's own cgroup*, so a sandbox can never escape the limits the host put on
us. When neither is usable, `CgroupFactory.available()` is False and the caller falls back to rlimits.
Group names carry the owner tag of leftovers.py, so `sweep_stale()` can remove what a killed run left.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.sandbox import leftovers

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()
_NAME = re.compile(r"^harnessrl-sb-(\d+)\.(\d+)\.(\d+)-\d+$")


def _own_cgroup_paths() -> dict[str, str]:
    """controller name ('' for v2) -> path of this process's cgroup in that hierarchy."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)


@dataclass
class Cgroup:
    """One command's cgroup(s). `procs_files` are written with the command's pid before it execs."""

    dirs: list[Path]
    version: int
    procs_files: list[Path] = field(default_factory=list)

    def events(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control", "pids.events"):
                f = d / name
                with contextlib.suppress(OSError):
                    for line in f.read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if not value.strip().isdigit():
                            continue
                        if name.startswith("pids") and key == "max":
                            out["pids_max"] = out.get("pids_max", 0) + int(value)
                        elif key == "oom_kill":
                            out["oom_kill"] = out.get("oom_kill", 0) + int(value)
        return {k: v for k, v in out.items() if v}

    def kill_all(self) -> None:
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self, wait_s: float = 2.0) -> None:
        self.kill_all()
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self.kill_all()
                    time.sleep(0.02)


class CgroupFactory:
    """Finds a usable cgroup setup once; `create()` makes a limited group per command."""

    def __init__(self) -> None:
        self.version = 0
        self.parents: dict[str, Path] = {}
        own = _own_cgroup_paths()
        v2_parent = CGROUP_ROOT / own.get("", "/").lstrip("/")
        unified = CGROUP_ROOT / "unified" / own.get("", "/").lstrip("/")
        for cand in (v2_parent, unified):
            ctrl = cand / "cgroup.subtree_control"
            if (cand / "cgroup.controllers").is_file() and _writable_dir(cand):
                have = set((cand / "cgroup.controllers").read_text().split())
                enabled = set(ctrl.read_text().split()) if ctrl.is_file() else set()
                # A v2 group can hold processes only in leaves: our own cgroup usually holds us, so only
                # use v2 if memory+pids are already delegated to children.
                if {"memory", "pids"} <= have and {"memory", "pids"} <= enabled:
                    self.version = 2
                    self.parents = {"": cand}
                    return
        v1 = {}
        for c in ("memory", "pids"):
            p = CGROUP_ROOT / c / own.get(c, "/").lstrip("/")
            if _writable_dir(p) and (p / "cgroup.procs").is_file():
                v1[c] = p
        if len(v1) == 2:
            self.version = 1
            self.parents = v1

    def available(self) -> bool:
        return self.version in (1, 2)

    def create(self, memory_bytes: int, pids: int) -> Cgroup:
        name = f"harnessrl-sb-{leftovers.current_tag()}-{next(_counter)}"
        dirs: list[Path] = []
        try:
            if self.version == 2:
                d = self.parents[""] / name
                d.mkdir()
                dirs.append(d)
                (d / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(pids))
                return Cgroup(dirs=dirs, version=2, procs_files=[d / "cgroup.procs"])
            mem = self.parents["memory"] / name
            pid = self.parents["pids"] / name
            mem.mkdir()
            dirs.append(mem)
            pid.mkdir()
            dirs.append(pid)
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):  # only when swap accounting is on
                (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (pid / "pids.max").write_text(str(pids))
            return Cgroup(dirs=dirs, version=1, procs_files=[mem / "cgroup.procs", pid / "cgroup.procs"])
        except OSError:
            Cgroup(dirs=dirs, version=self.version).remove()
            raise

    def sweep_stale(self) -> int:
        """Removes groups whose creating process is gone (killing anything still in them); returns how many."""
        removed = 0
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                for entry in os.scandir(parent):
                    m = _NAME.match(entry.name)
                    if m is None or not entry.is_dir(follow_symlinks=False) or not leftovers.owner_gone(m):
                        continue
                    d = Path(entry.path)
                    Cgroup(dirs=[d], version=self.version).remove()
                    if not d.exists():
                        removed += 1
                        logger.info("removed cgroup %s, left by a harnessrl process that no longer runs", d)
        return removed


_factory: CgroupFactory | None = None


def factory() -> CgroupFactory:
    global _factory
    if _factory is None:
        _factory = CgroupFactory()
    return _factory
