"""Workspace quota: what a sandboxed command (or the harness on its behalf) may leave on the host disk.

The incident: 2 GB of files landed on the host disk from one rollout. Each command below writes a bounded
amount (so the old code, with no quota, finishes instead of filling the disk) that is well over its quota.
"""

from __future__ import annotations

import os

import pytest

from harnessrl.harness.runtime import SandboxRuntime
from harnessrl.harness.tools import EDITOR, parse_arguments
from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.sandbox.quota import MAX_DEPTH, Quota, Usage, measure
from tests.support.fixtures import requires_bwrap

WRITE_400MB = "for i in $(seq 40); do head -c 10M /dev/zero > f$i; done"


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    (d / "repo.py").write_text("x = 1\n" * 1000)
    return d


@requires_bwrap
def test_a_command_filling_the_disk_is_stopped_near_the_quota(ws):
    with BubblewrapSandbox(ws, limits=Limits(workspace_mb=50)) as sb:
        r = sb.run(WRITE_400MB, timeout=60)
        landed = measure(ws).bytes
        assert r.outcome is Outcome.RESOURCE_LIMIT and "workspace quota" in r.detail, (r.outcome, r.detail)
        assert landed < 200 << 20, f"{landed >> 20} MB landed for a 50 MB quota"  # stopped, not finished
        # over quota, commands still run (to delete), and growth within the quota works again
        cleanup = sb.run("rm -f f* && head -c 1M /dev/zero > small && echo done", timeout=30)
    assert cleanup.outcome is Outcome.OK and "done" in cleanup.stdout, (cleanup.outcome, cleanup.detail)
    assert measure(ws).bytes < 2 << 20


@requires_bwrap
@pytest.mark.parametrize(
    "cmd, limits, detail",
    [
        ("mkdir d && cd d && touch $(seq 3000)", Limits(workspace_files=1000), "files"),
        ("truncate -s 300M sparse", Limits(workspace_mb=50), "MB"),  # no disk blocks, but a 300 MB diff
        (f"mkdir -p $(printf 'd/%.0s' $(seq {MAX_DEPTH + 20}))", Limits(), "nested deeper"),
    ],
    ids=["file-count", "sparse-file", "deep-nesting"],
)
def test_other_ways_to_blow_the_workspace(ws, cmd, limits, detail):
    with BubblewrapSandbox(ws, limits=limits) as sb:
        r = sb.run(cmd, timeout=60)
    assert r.outcome is Outcome.RESOURCE_LIMIT and detail in r.detail, (r.outcome, r.detail, r.stderr[-300:])


@requires_bwrap
def test_the_editor_cannot_write_past_the_quota(ws):
    with BubblewrapSandbox(ws, limits=Limits(workspace_mb=1)) as sb:
        runtime = SandboxRuntime(sb, ws)
        args = parse_arguments(EDITOR, {"command": "create", "path": "big.txt", "file_text": "x" * (2 << 20)})
        refused = EDITOR.execute(args, runtime, 10).content
        args["file_text"] = "x" * 1000
        allowed = EDITOR.execute(args, runtime, 10).content
    assert refused.startswith("Error:") and "quota" in refused, refused
    assert allowed.startswith("File created") and (ws / "big.txt").stat().st_size == 1000


def test_measure_counts_without_following_links_or_leaving_the_root(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 5000)
    os.symlink("/usr", tmp_path / "usr-link")  # never walked into
    (tmp_path / "sub").mkdir()
    os.symlink("..", tmp_path / "sub" / "up")
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(10 << 20)
    u = measure(tmp_path)
    assert u.files == 5 and 10 << 20 < u.bytes < (10 << 20) + (1 << 20), u
    q = Quota(max_bytes=1 << 20, max_files=100)
    assert "MB" in q.violation(measure(tmp_path, stop_at=q))
    assert q.relaxed_to(u).violation(u) == ""  # a workspace already over quota may shrink
    assert Quota.growth(Usage(100, 3), Limits(workspace_mb=1, workspace_files=2)) == Quota(100 + (1 << 20), 5)
