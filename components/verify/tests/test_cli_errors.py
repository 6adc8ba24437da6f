"""`harnessrl verify` on a broken task set: one error line naming the file or branch and the fix, never a
traceback (the CLI runs as a real subprocess)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.io import read_jsonl, write_jsonl
from tests.support.fixtures import requires_bwrap

HARNESSRL = str(Path(sys.executable).parent / "harnessrl")


def _verify(tasks: Path, iid: str, tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "empty.diff"
    empty.write_text("")
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    arg = ["--patch", str(empty)] if source == "patch" else ["--workspace", str(ws)]
    cmd = [HARNESSRL, "verify", "--tasks", str(tasks), "--instance", iid, *arg]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _assert_one_line_error(p: subprocess.CompletedProcess[str], *names: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harnessrl: error: "), p.stderr
    for name in names:
        assert name in lines[0], lines[0]
    assert "harnessrl tasks import" in lines[0] or "harnessrl stage clean" in lines[0]  # the fix


@requires_bwrap
@pytest.mark.parametrize("source", ["patch", "workspace"])
def test_missing_bundle_is_one_line(synth_taskset, tmp_path, source):
    tasks = tmp_path / "tasks"
    shutil.copytree(synth_taskset, tasks)
    bundle = next((tasks / "repos").glob("*.bundle"))
    bundle.unlink()
    iid = next(read_jsonl(tasks / "tasks.jsonl"))["instance_id"]
    _assert_one_line_error(_verify(tasks, iid, tmp_path, source), str(bundle), "no bundle")


@requires_bwrap
@pytest.mark.parametrize("source", ["patch", "workspace"])
def test_missing_task_branch_is_one_line(synth_taskset, tmp_path, source):
    tasks = tmp_path / "tasks"
    shutil.copytree(synth_taskset, tasks)
    rows = list(read_jsonl(tasks / "tasks.jsonl"))
    rows[0]["instance_id"] = "minirepo.ghost__no_such_branch"
    write_jsonl(tasks / "tasks.jsonl", rows)
    p = _verify(tasks, rows[0]["instance_id"], tmp_path, source)
    _assert_one_line_error(p, "no branch 'minirepo.ghost__no_such_branch'")


@requires_bwrap
def test_corrupt_bundle_is_one_line(synth_taskset, tmp_path):
    tasks = tmp_path / "tasks"
    shutil.copytree(synth_taskset, tasks)
    bundle = next((tasks / "repos").glob("*.bundle"))
    bundle.write_bytes(b"not a git bundle\n" * 3)
    iid = next(read_jsonl(tasks / "tasks.jsonl"))["instance_id"]
    _assert_one_line_error(_verify(tasks, iid, tmp_path, "patch"), str(bundle), "cannot unpack")


@requires_bwrap
@pytest.mark.parametrize("field, value", [("repo", None), ("FAIL_TO_PASS", "not json [")])
def test_malformed_task_row_is_one_line(synth_taskset, tmp_path, field, value):
    tasks = tmp_path / "tasks"
    shutil.copytree(synth_taskset, tasks)
    rows = list(read_jsonl(tasks / "tasks.jsonl"))
    rows[0][field] = value
    write_jsonl(tasks / "tasks.jsonl", rows)
    p = _verify(tasks, rows[0]["instance_id"], tmp_path, "patch")
    _assert_one_line_error(p, str(tasks / "tasks.jsonl"), f"field {field!r}", "harnessrl stage clean")
