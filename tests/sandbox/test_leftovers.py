"""kill -9 in the middle of a sandboxed command, then a rerun: the rerun sweeps what the dead run left (temp
dirs, cgroups) and nothing that belongs to a live process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from harnessrl.sandbox import cgroups, leftovers
from tests.sandbox.support import wait_for
from tests.support.fixtures import requires_bwrap

REPO = Path(__file__).parents[2]
MARKER = "harnessrl-leftover-test-sleep"
VICTIM = f"""
import sys
from pathlib import Path
from harnessrl.sandbox.bwrap import BubblewrapSandbox
sb = BubblewrapSandbox(Path(sys.argv[1]), git_stub=True)
sb.run("touch started; sleep 60; echo {MARKER}", timeout=120)
"""


def _left_by(pid: int) -> list[Path]:
    found = [p for p in Path(tempfile.gettempdir()).glob(f"harnessrl-*-{pid}.*")]
    for parent in cgroups.factory().parents.values():
        found += list(parent.glob(f"harnessrl-sb-{pid}.*"))
    return found


def _processes_with(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                pass
    return out


@requires_bwrap
def test_a_rerun_sweeps_what_a_killed_run_left(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(ws)], env=env, cwd=REPO)
    try:
        assert wait_for(lambda: (ws / "started").exists(), 30)
        left = _left_by(victim.pid)
        kinds = {p.name.split("-")[1] for p in left}
        assert {"run", "gitstub"} <= kinds, left
        if os.geteuid() == 0:
            assert "stage" in kinds, left
        if cgroups.factory().available():
            assert "sb" in kinds, left
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    # the sandboxed command dies with it (bubblewrap's parent-death signal), leaving only files behind
    assert wait_for(lambda: _processes_with(MARKER) == [], 10), _processes_with(MARKER)
    assert all(p.exists() for p in left)
    mine = leftovers.make_tempdir("run")  # a live owner's dir: must survive the sweep
    try:
        rerun = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from harnessrl.sandbox.bwrap import BubblewrapSandbox as B; B({str(ws)!r}).close()",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rerun.returncode == 0, rerun.stderr
        assert _left_by(victim.pid) == []
        assert mine.is_dir()
    finally:
        mine.rmdir()


def test_only_dead_owners_in_this_pid_namespace_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    ns = os.stat("/proc/self/ns/pid").st_ino
    names = {
        "dead": f"harnessrl-run-{dead.pid}.1.{ns}-x",
        "reused-pid": f"harnessrl-run-{os.getpid()}.{int(start) + 1}.{ns}-x",  # our pid, another start
        "alive": f"harnessrl-run-{os.getpid()}.{start}.{ns}-x",
        "other-namespace": f"harnessrl-run-{dead.pid}.1.{ns + 1}-x",
        "not-ours": "harnessrl-run-x",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    stale = {p.name for p in leftovers.stale_temp_dirs(tmp_path)}
    assert stale == {names["dead"], names["reused-pid"]}
