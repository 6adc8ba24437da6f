"""How a finished or killed command becomes a `RunResult`, the same way on every backend: a timeout (or the
limits hit before it), then the exit code read against the limit events (OOM kills, refused forks), the
signals rlimits send (SIGXCPU, SIGXFSZ) and, where limits are only rlimits, what the process printed."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from harnessrl.sandbox.base import Outcome, RunResult

# Messages a process prints when an rlimit (not a cgroup) stopped it; used only when no cgroup is available
# and only for a failing command.
RLIMIT_MARKERS = re.compile(
    r"MemoryError|Cannot allocate memory|Resource temporarily unavailable|"
    r"fork: retry|File too large|std::bad_alloc"
)
_TAIL = 200_000  # how much of the end of stdout/stderr is searched for markers
MAX_OUTPUT_BYTES = 2 << 20  # per stream kept in the result: head + tail around a truncation marker


def limits_hit(events: dict[str, int]) -> str:
    hit = []
    if events.get("oom_kill"):
        hit.append(f"memory limit ({events['oom_kill']} OOM kill(s))")
    if events.get("pids_max"):
        hit.append(f"process limit ({events['pids_max']} fork(s) refused)")
    return "; ".join(hit)


def timed_out(events: dict[str, int], stdout: str, stderr: str, wall: float, timeout: float) -> RunResult:
    """Killed at the wall-clock limit; a resource limit if limits were hit first (e.g. a fork bomb: refused
    forks, then spinning until the clock ran out)."""
    if events:
        detail = f"{limits_hit(events)}, then killed at the {timeout:g} s wall-clock limit"
        return RunResult(Outcome.RESOURCE_LIMIT, None, stdout, stderr, wall, detail, events)
    detail = f"killed after the {timeout:g} s wall-clock limit"
    return RunResult(Outcome.TIMEOUT, None, stdout, stderr, wall, detail, events)


def exited(
    code: int, events: dict[str, int], stdout: str, stderr: str, wall: float, exact_limits: bool = True
) -> RunResult:
    """The command ran and exited with `code`. `exact_limits`: memory/process limits are cgroups with
    events; without them a SIGKILL or an rlimit message in the output is read as a limit too."""
    if code == 0:
        return RunResult(Outcome.OK, 0, stdout, stderr, wall, "", events)
    if events:
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, limits_hit(events), events)
    signum = code - 128 if code > 128 else 0
    if signum in (signal.SIGXCPU, signal.SIGXFSZ) or (signum == signal.SIGKILL and not exact_limits):
        detail = f"killed by {signal.Signals(signum).name}"
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, detail, events)
    output_tail = stdout[-_TAIL:] + stderr[-_TAIL:]
    if not exact_limits and RLIMIT_MARKERS.search(output_tail):
        detail = "rlimit reached (from output)"
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, detail, events)
    if "File too large" in output_tail:
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, "file size limit", events)
    return RunResult(Outcome.NONZERO, code, stdout, stderr, wall, "", events)


def read_capped(path: Path, cap: int = MAX_OUTPUT_BYTES) -> str:
    """A command's captured stream, at most `cap` bytes of it: its head and tail around a marker."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= cap:
            data = f.read()
        else:
            head = f.read(cap // 2)
            f.seek(size - cap // 2)
            tail = f.read()
            data = head + f"\n[... {size - cap} bytes truncated ...]\n".encode() + tail
    return data.decode("utf-8", errors="replace")
