"""Every kind of child the product starts, started from a process the kernel refuses to fork (harnessrl/
processes.py says why launches avoid fork). Each case runs tests/support/memory_pressure.py in a fresh process
that reserves 1.5 x (RAM + swap) of private writable memory without touching it, asserts from the kernel's
own view of that mapping (/proc/self/smaps: accounted, private, writable, larger than RAM + swap) that a fork()
of it would be refused (so each case could fail; the child does not fork, which the kernel would log as a
failed allocation), then launches through the product's code: a
bubblewrap sandbox command, a podman container (of a tiny image of the host's sh and sleep, made once), the
pinned Claude Code CLI in a sandbox, vLLM's server process (stopped once vLLM runs), `harnessrl engine serve`,
a local Ray cluster with one task, two torchrun ranks, and a kfp.local step. Skips: vm.overcommit_memory not 0
(then no fork is refused for its size), the address space cannot be reserved, or a kind's tool is missing
here.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.memory_pressure import LAUNCHES, probe_image

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 300

OVERCOMMIT = Path("/proc/sys/vm/overcommit_memory")
pytestmark = pytest.mark.skipif(
    not OVERCOMMIT.is_file() or OVERCOMMIT.read_text().strip() != "0",
    reason="vm.overcommit_memory is not 0 (the heuristic that refuses to fork a process bigger than RAM)",
)


def _not_here(kind: str) -> str | None:
    """Why `kind` cannot be started on this machine, or None."""
    if kind in ("bwrap", "cli_agent") and shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) not installed"
    if kind == "podman":
        from harnessrl.sandbox.images import podman_problem

        problem = podman_problem()
        return f"podman: {problem}" if problem else None
    if kind == "cli_agent":
        from harnessrl.harness.cli_agents import CLAUDE_CODE, skip_reason

        return skip_reason(CLAUDE_CODE)
    if kind == "vllm":
        from harnessrl.engine.vllm_server import vllm_unavailable

        return vllm_unavailable()
    if kind == "ray" and importlib.util.find_spec("ray") is None:
        return "ray is not installed in this environment"
    return None


@pytest.mark.parametrize("kind", list(LAUNCHES))
def test_a_process_too_big_to_fork_starts_it(kind, tmp_path):
    reason = _not_here(kind)
    if reason:
        pytest.skip(reason)
    if kind == "podman":
        probe_image()
    command = [sys.executable, "-m", "tests.support.memory_pressure", kind, str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, f"{kind}: the launch failed:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    assert report["fork_refused"], (
        f"with {report['reserved_gib']} GiB reserved, the kernel would not refuse a fork (its mapping is not "
        "accounted or not larger than RAM + swap): this test no longer shows anything"
    )
    assert report["started"], report
