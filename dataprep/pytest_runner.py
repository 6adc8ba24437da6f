"""Run a repository's pytest suite in a directory and read per-test outcomes from the `-rA` summary.

`run_pytest` is a pure function of its inputs (directory, test ids, timeout, interpreter): a sandboxed runner
(bubblewrap, a Kubernetes Job) only has to produce the same `TestRun` from the same `pytest_command`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+?)(?: - (.*))?$")
_FINAL_LINE = re.compile(r"^=+ .*(passed|failed|error|skipped|no tests ran).* =+$")


@dataclass
class TestRun:
    __test__ = False  # not a pytest test class

    outcomes: dict[str, str] = field(
        default_factory=dict
    )  # node id -> PASSED | FAILED | ERROR | XFAIL | XPASS
    messages: dict[str, str] = field(default_factory=dict)  # node id -> short failure message
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    log_tail: str = ""

    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o in ("PASSED", "XFAIL")}


# A runner: (work dir, test ids (empty = whole suite), timeout seconds) -> TestRun.
TestRunner = Callable[[Path, Sequence[str], float], TestRun]


def pytest_command(test_ids: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "pytest",
        "-rA",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--tb=short",
        "--color=no",
        *test_ids,
    ]


def pytest_env(workdir: Path, plugin_autoload: bool = True) -> dict[str, str]:
    """No bytecode (a mutated file can keep its size and mtime second), the repo importable, wide lines."""
    paths = [str(workdir)] + ([str(workdir / "src")] if (workdir / "src").is_dir() else [])
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")}
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        COLUMNS="400",
        NO_COLOR="1",
    )
    if not plugin_autoload:  # skips importing every installed pytest plugin: halves a small suite's run time
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def parse_pytest_report(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Outcomes and failure messages per node id from pytest's `-rA` short summary section."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    in_summary = False
    for line in text.splitlines():
        if _SUMMARY_HEADER.match(line):
            in_summary = True
            continue
        if not in_summary:
            continue
        if _FINAL_LINE.match(line):
            break
        m = _SUMMARY_LINE.match(line)
        if m is None:
            continue
        outcome, node_id, message = m.groups()
        if "::" not in node_id and outcome == "ERROR":
            outcomes[node_id] = "ERROR"  # collection error of a whole file; its tests count as missing
        else:
            outcomes[node_id] = outcome
        if message:
            messages[node_id] = message.strip()
    return outcomes, messages


def run_pytest(
    workdir: Path,
    test_ids: Sequence[str] = (),
    timeout_s: float = 120.0,
    python: str = sys.executable,
    plugin_autoload: bool = True,
) -> TestRun:
    """Runs pytest with cwd=workdir; kills the whole process group on timeout."""
    start = time.monotonic()
    proc = subprocess.Popen(
        pytest_command(test_ids, python),
        cwd=workdir,
        env=pytest_env(workdir, plugin_autoload),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    text = out.decode("utf-8", errors="replace")
    outcomes, messages = parse_pytest_report(text)
    return TestRun(
        outcomes=outcomes,
        messages=messages,
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        log_tail=text[-4000:],
    )
