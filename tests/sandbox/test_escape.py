"""Escapes from the bubblewrap sandbox to the host, attempted for real (also, and especially, as root).

The reported escape: as root the sandbox kept euid 0, /proc/sys was writable, an agent set
`kernel.core_pattern` to `|<its host workspace>/h.sh` (the path read from pid 1's argv) and crashed a process:
h.sh ran as host root. Every write here puts back the value it read (see tests/sandbox/support.py).
"""

from __future__ import annotations

import threading

import pytest

from harnessrl.harness.runtime import SandboxRuntime
from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.sandbox.envs import ensure_env
from tests.sandbox.support import (
    SYSCTLS,
    CredentialSampler,
    host_sysctls,
    parse_probe,
    sysctl_probe_script,
    wait_for,
)
from tests.support.fixtures import requires_bwrap

pytestmark = requires_bwrap


@pytest.fixture
def rollout_ws(task, tmp_path):
    """A workspace and sandbox built the way the generate stage builds them."""
    ws = task.workspace(tmp_path / "ws")
    sandbox = BubblewrapSandbox(ws, ensure_env(task.taskset, task.row["repo"]), limits=Limits())
    yield ws, sandbox
    sandbox.close()


def test_sysctl_writes_fail_and_host_paths_are_not_in_pid1_argv(rollout_ws):
    ws, sandbox = rollout_ws
    before = host_sysctls()
    (ws / "probe.py").write_text(sysctl_probe_script())
    res = SandboxRuntime(sandbox, ws).run_shell("python probe.py", timeout=60)
    assert res.outcome == "ok", res.output
    probe = parse_probe(res.output)
    assert set(probe["sysctl"]) == set(SYSCTLS)
    written = [name for name, outcome in probe["sysctl"].items() if outcome == "WRITTEN"]
    assert written == [], probe
    assert set(probe["sysctl"].values()) <= {"EROFS", "EACCES", "EPERM"}, probe
    assert "/proc/sys" in probe["proc_read_only"] and all(probe["proc_read_only"].values()), probe
    assert str(ws) not in probe["pid1_cmdline"] and str(ws.parent) not in probe["pid1_cmdline"], probe
    assert host_sysctls() == before


def test_sandboxed_process_is_not_root_on_the_host(rollout_ws):
    ws, sandbox = rollout_ws
    marker = "harnessrl-escape-marker"
    cmd = f"touch ready; while [ ! -e go ]; do sleep 0.05; done; echo {marker} >/dev/null; id -u"
    result = {}
    with CredentialSampler(marker.encode()) as sampler:
        runner = threading.Thread(target=lambda: result.update(r=sandbox.run(cmd, timeout=60)))
        runner.start()
        try:
            assert wait_for(lambda: (ws / "ready").exists())
            assert wait_for(lambda: bool(sampler.seen))
        finally:
            (ws / "go").touch()
            runner.join()
    assert result["r"].outcome is Outcome.OK, result["r"]
    assert sampler.seen, "the sandboxed shell was never seen from the host"
    for creds in sampler.seen.values():
        uids, gids = creds["Uid"].split(), creds["Gid"].split()
        assert "0" not in uids and "0" not in gids, creds  # real, effective, saved and filesystem ids
        assert int(creds["CapEff"], 16) == 0, creds
    assert (ws / "ready").stat().st_uid != 0  # what it writes lands as that unprivileged user


def test_core_pattern_pipe_to_workspace_script_never_runs(rollout_ws, tmp_path):
    """The exploit as reported, end to end, minus the part that would change the host: the write is
    attempted with the host's current value, and a crash follows; nothing may run outside."""
    ws, sandbox = rollout_ws
    before = host_sysctls()
    witness = tmp_path / "pwned"
    (ws / "h.sh").write_text(f"#!/bin/sh\ntouch {witness}\n")
    (ws / "h.sh").chmod(0o755)
    exploit = (
        "import os, signal\n"
        "value = open('/proc/sys/kernel/core_pattern', 'rb').read()\n"
        "try:\n"
        "    fd = os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)\n"
        "    os.write(fd, value)\n"
        "    print('WRITTEN')\n"
        "except OSError as e:\n"
        "    print('denied', e)\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    (ws / "exploit.py").write_text(exploit)
    r = sandbox.run(["python", "exploit.py"], timeout=60)
    assert "WRITTEN" not in r.stdout and "denied" in r.stdout, (r.stdout, r.stderr)
    assert not witness.exists()
    assert host_sysctls() == before


def test_nested_user_namespaces_are_disabled(rollout_ws):
    _, sandbox = rollout_ws
    r = sandbox.run("unshare --user true && echo NESTED", timeout=30)
    assert r.outcome is Outcome.NONZERO and "NESTED" not in r.stdout, (r.stdout, r.stderr)
