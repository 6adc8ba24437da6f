"""Probes for sandbox-escape tests, shared by tests/sandbox and tests/verify.

The sysctl probe never changes a host setting: it reads each value and writes back exactly what it read, so a
write that succeeds (the vulnerability) leaves the host as it was and is still reported as `WRITTEN`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

# kernel.core_pattern and kernel.poweroff_cmd name programs the kernel runs as host root; the other two are
# global knobs no sandbox may touch.
SYSCTLS = ("kernel/core_pattern", "kernel/poweroff_cmd", "fs/suid_dumpable", "vm/overcommit_memory")
PROC_COVERED = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")

SYSCTL_PROBE = f"""
def _harnessrl_sysctl_probe():
    import errno, os
    out = {{}}
    for name in {SYSCTLS!r}:
        path = "/proc/sys/" + name
        try:
            with open(path, "rb") as f:
                value = f.read()
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, value)
            finally:
                os.close(fd)
            out[name] = "WRITTEN"
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, str(e.errno))
    mounts = {{}}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mounts[fields[4]] = fields[5].split(",")
    covered = {{p: ("ro" in mounts.get(p, [])) for p in {PROC_COVERED!r} if os.path.exists(p)}}
    with open("/proc/1/cmdline", "rb") as f:
        pid1 = f.read().replace(b"\\0", b" ").decode(errors="replace")
    return {{"sysctl": out, "proc_read_only": covered, "pid1_cmdline": pid1}}
"""


def sysctl_probe_script() -> str:
    """A standalone script printing the probe's result as one JSON line."""
    return SYSCTL_PROBE + "\nimport json\nprint('PROBE ' + json.dumps(_harnessrl_sysctl_probe()))\n"


def parse_probe(output: str) -> dict:
    line = next(ln for ln in output.splitlines() if "PROBE {" in ln)
    return json.loads(line[line.index("PROBE ") + len("PROBE ") :])


def host_sysctls() -> dict[str, bytes]:
    return {name: Path("/proc/sys", name).read_bytes() for name in SYSCTLS}


def descendants(pid: int) -> list[int]:
    """Every live (non-zombie) process below `pid`: sandboxed processes stay below it until their namespace
    dies, so a sandbox that left something running shows up here."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def host_credentials(pid: int) -> dict[str, str] | None:
    """Uid / Gid / CapEff lines of a process as the host sees them (None if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return {
        k: v.strip()
        for k, _, v in (ln.partition(":") for ln in status.splitlines())
        if k in ("Uid", "Gid", "CapEff")
    }


class CredentialSampler:
    """Samples, from the host, the credentials of every process below this one that runs in another pid
    namespace (inside a sandbox) with `marker` in its command line, bubblewrap's own pid 1 aside."""

    def __init__(self, marker: bytes, interval_s: float = 0.02):
        self.marker, self.interval_s = marker, interval_s
        self.seen: dict[int, dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        me = os.getpid()
        own_ns = os.readlink("/proc/self/ns/pid")
        while not self._stop.is_set():
            for pid in descendants(me):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    inside = os.readlink(f"/proc/{pid}/ns/pid") != own_ns
                except OSError:
                    continue
                if inside and self.marker in cmdline and not cmdline.split(b"\0")[0].endswith(b"bwrap"):
                    creds = host_credentials(pid)
                    if creds:
                        self.seen[pid] = creds
            time.sleep(self.interval_s)

    def __enter__(self) -> CredentialSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False
