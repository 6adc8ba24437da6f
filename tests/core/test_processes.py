"""harnessrl/processes.py: a command behind `die_with_parent` runs as itself (same pid, its output and exit
code), finds its program on the PATH of the environment it is given, and gets SIGTERM when the thread that
started it exits, with no fork() on the way (tests/core/test_launch_under_memory_pressure.py: from a process
the kernel would refuse to fork)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harnessrl.processes import die_with_parent, free_ports

EXEC_WITHIN_S = 30.0


def _wait_exec(pid: int, program: bytes) -> None:
    """Until process `pid` runs `program` (the launcher has exec'd it, so prctl is done)."""
    deadline = time.monotonic() + EXEC_WITHIN_S
    while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(program):
        assert time.monotonic() < deadline, f"process {pid} did not exec {program!r}"
        time.sleep(0.01)


def test_the_command_runs_as_itself():
    done = subprocess.run(
        die_with_parent(["sh", "-c", 'echo "hello $0"; exit 3', "there"]), capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "hello there\n", "")


def test_the_program_is_found_on_the_given_path_or_refused_here(tmp_path):
    tool = tmp_path / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    assert (
        subprocess.run(die_with_parent(["only-here"], env), env=env, capture_output=True).stdout == b"found\n"
    )
    with pytest.raises(FileNotFoundError, match="only-here"):
        die_with_parent(["only-here"], {"PATH": "/usr/bin:/bin"})
    with pytest.raises(FileNotFoundError):
        die_with_parent([str(tmp_path / "missing")])


def test_the_child_gets_sigterm_when_its_starting_thread_exits():
    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        proc = subprocess.Popen(die_with_parent(["sleep", "600"]))
        started.append(proc)
        _wait_exec(proc.pid, b"sleep")

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    proc = started[0]
    try:
        assert proc.wait(EXEC_WITHIN_S) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_free_ports_are_distinct():
    ports = free_ports(8)
    assert len(set(ports)) == 8
