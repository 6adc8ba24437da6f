import json
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from dataprep.pytest_runner import run_pytest
from dataprep.synthesize import SynthesisError, synthesize_taskset
from harnessrl.cli import main
from harnessrl.taskset import TaskSet

MINIREPO = Path(__file__).resolve().parents[1] / "fixtures" / "minirepo"
IID = re.compile(r"^minirepo\.[0-9a-f]{7}__func_pm_[a-z_]+__\d+$")


def sh(cwd: Path, *args: str) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def clone(bundle: Path, dest: Path, branch: str) -> Path:
    sh(bundle.parent, "git", "clone", "-q", str(bundle), str(dest))
    sh(dest, "git", "checkout", "-q", branch)
    return dest


def test_rows_follow_swesmith_schema(synth_taskset):
    ts = TaskSet.open(synth_taskset)
    rows = ts.rows()
    assert len(rows) >= 3
    assert len({r["instance_id"] for r in rows}) == len(rows)
    for r in rows:
        assert IID.match(r["instance_id"]), r["instance_id"]
        assert re.match(r"^swesmith/minirepo\.[0-9a-f]{8}$", r["repo"])
        assert r["instance_id"].split("__")[0].split(".")[1] == r["repo"].split(".")[1][:7]
        assert r["FAIL_TO_PASS"] and r["PASS_TO_PASS"]
        assert not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])
        assert all("::" in t for t in r["FAIL_TO_PASS"] + r["PASS_TO_PASS"])
        assert r["patch"].startswith("diff --git a/minicalc/")
        assert "tests/" not in r["patch"]  # the bug touches source files only
        assert r["problem_statement"].strip() and r["created_at"] and r["image_name"]
        assert ts.bundle(r["repo"]).is_file()
    assert len({r["instance_id"].split("__")[1] for r in rows}) >= 2  # modifier families are interleaved


def test_problem_statement_does_not_leak_the_diff(synth_taskset):
    for r in TaskSet.open(synth_taskset).rows():
        changed = [
            line[1:].strip()
            for line in r["patch"].splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
        ]
        ps = r["problem_statement"]
        assert "minicalc/" not in ps and "diff" not in ps
        for line in changed:
            assert line not in ps, (r["instance_id"], line)


def test_bundle_has_swesmith_branch_layout(synth_taskset, tmp_path):
    ts = TaskSet.open(synth_taskset)
    rows = ts.rows()
    bundle = ts.bundle(rows[0]["repo"])
    heads = {
        line.split()[1] for line in sh(tmp_path, "git", "bundle", "list-heads", str(bundle)).splitlines()
    }
    assert heads - {"HEAD"} == {"refs/heads/main"} | {f"refs/heads/{r['instance_id']}" for r in rows}
    repo = clone(bundle, tmp_path / "repo", "main")
    assert sh(repo, "git", "log", "--format=%s", "main").split("\n")[:-1] == ["Initial commit"]
    assert sh(repo, "git", "rev-parse", "main").strip() == rows[0]["base_commit"]
    for r in rows:
        iid = r["instance_id"]
        sh(repo, "git", "branch", "-q", iid, f"origin/{iid}")
        assert sh(repo, "git", "log", "--format=%s", iid).splitlines() == [
            "Remove F2P Tests",
            "Bug Patch",
            "Initial commit",
        ]
        assert sh(repo, "git", "diff", "main", f"{iid}~1") == r["patch"]
        removed = sh(repo, "git", "diff", "--name-status", f"{iid}~1", iid).split()
        f2p_files = sorted({t.split("::")[0] for t in r["FAIL_TO_PASS"]})
        assert removed == [x for f in f2p_files for x in ("D", f)]


def test_bug_fails_and_gold_fix_resolves(synth_taskset, tmp_path):
    """A real pytest run on the task branch: F2P fail with the tests restored, pass after the reverse patch."""
    ts = TaskSet.open(synth_taskset)
    row = ts.rows()[0]
    repo = clone(ts.bundle(row["repo"]), tmp_path / "repo", f"origin/{row['instance_id']}")
    f2p_files = sorted({t.split("::")[0] for t in row["FAIL_TO_PASS"]})
    assert not any((repo / f).exists() for f in f2p_files)
    sh(repo, "git", "checkout", "main", "--", *f2p_files)
    tests = row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]
    buggy = run_pytest(repo, tests, timeout_s=60, plugin_autoload=False)
    assert not set(row["FAIL_TO_PASS"]) & buggy.passed()
    assert set(row["PASS_TO_PASS"]) <= buggy.passed()
    subprocess.run(["git", "apply", "-R", "-"], cwd=repo, input=row["patch"], text=True, check=True)
    fixed = run_pytest(repo, tests, timeout_s=60, plugin_autoload=False)
    assert set(tests) <= fixed.passed()


def test_manifest_records_every_candidate(synth_taskset):
    m = json.loads((synth_taskset / "manifest.json").read_text())["synthesis"]
    kept = [c for c in m["candidates"] if c["status"] == "kept"]
    rejected = [c for c in m["candidates"] if c["status"] == "rejected"]
    assert len(kept) == m["kept"] == len(TaskSet.open(synth_taskset).rows())
    assert len(kept) + len(rejected) == m["candidates_tried"]
    assert all(c["reason"] for c in rejected) and not any(c["reason"] for c in kept)
    assert m["baseline"]["stable_passing"] == 18 and m["seed"] == 0


def test_cli_from_sdist_is_deterministic_and_replaces_output(synth_taskset, tmp_path, capsys):
    """`harnessrl tasks synthesize` on an sdist of the same files, same seed -> byte-identical tasks;
    a rerun into an existing directory replaces it whole."""
    sdist = tmp_path / "minirepo-0.1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for path in sorted(MINIREPO.rglob("*")):
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            tar.add(path, arcname=f"minirepo-0.1.0/{path.relative_to(MINIREPO)}", recursive=False)
    out = tmp_path / "again"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")
    rc = main(["tasks", "synthesize", str(sdist), "--out", str(out), "--max-tasks", "2", "--seed", "0"])
    assert rc == 0 and capsys.readouterr().out.startswith("2 tasks from")
    ts = TaskSet.open(out)
    assert ts.rows() == TaskSet.open(synth_taskset).rows()[:2]
    assert ts.manifest["synthesis"]["name"] == "minirepo"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "repos", "tasks.jsonl"]


def test_source_without_passing_tests_is_a_clear_error(tmp_path):
    repo = tmp_path / "broken"
    (repo / "tests").mkdir(parents=True)
    (repo / "lib.py").write_text("def f(x):\n    return x + 1\n")
    (repo / "tests" / "test_lib.py").write_text("from lib import f\n\ndef test_f():\n    assert f(1) == 3\n")
    with pytest.raises(SynthesisError, match="no test passes on the unmodified source"):
        synthesize_taskset(repo, tmp_path / "out", max_tasks=1)
    assert not (tmp_path / "out").exists()


def test_missing_or_unsupported_source(tmp_path):
    with pytest.raises(SynthesisError, match="no such file"):
        synthesize_taskset(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(SynthesisError, match="not a directory or a .tar.gz"):
        synthesize_taskset(tmp_path / "notes.txt", tmp_path / "out")


def test_runner_kills_a_hanging_suite(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    start = time.monotonic()
    run = run_pytest(tmp_path, (), timeout_s=3)
    assert run.timed_out and run.returncode is None
    assert time.monotonic() - start < 30
