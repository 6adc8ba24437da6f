import json
import subprocess

import pytest

from dataprep.clean import CleanParams, RejectReason, clean_taskset, patch_problem, run_clean_stage
from harnessrl.io import read_jsonl
from harnessrl.taskset import TaskSet, write_taskset


def unique_patch(i: int) -> str:
    return f"diff --git a/f{i}.py b/f{i}.py\n--- a/f{i}.py\n+++ b/f{i}.py\n@@ -1 +1 @@\n-a = {i}\n+a = -{i}\n"


@pytest.fixture()
def dirty_taskset(synth_taskset, tmp_path):
    """The synthesized tasks plus one row per cleaning rule (and one row breaking two rules).

    Each dirty row gets its own branch in the bundle (except where the branch must be missing) and its own
    patch, so it breaks exactly the rules it is meant to break."""
    src = TaskSet.open(synth_taskset)
    good = src.rows()
    repo = good[0]["repo"]

    def dirty(i: int, **over) -> dict:
        return {
            **good[0],
            "instance_id": f"{good[0]['instance_id']}.dirty{i}",
            "patch": unique_patch(i),
            **over,
        }

    bad = [
        dirty(0, problem_statement="  \n"),
        dirty(1),  # no branch (see below)
        dirty(2, repo="swesmith/other.00000000"),
        dirty(3, PASS_TO_PASS=[f"tests/test_x.py::test_{i}" for i in range(201)]),
        dirty(4, FAIL_TO_PASS=[]),
        dirty(5, patch=unique_patch(5).rsplit("\n", 2)[0] + "\n"),  # truncated hunk
        dict(good[2]),  # exact duplicate
        dirty(7, problem_statement=""),  # two reasons: also no branch
    ]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--mirror", str(src.bundle(repo)), str(clone)], check=True)
    for r in bad:
        if ".dirty" in r["instance_id"] and not r["instance_id"].endswith(("dirty1", "dirty2", "dirty7")):
            subprocess.run(["git", "branch", r["instance_id"], "main"], cwd=clone, check=True)
    subprocess.run(
        ["git", "bundle", "create", "-q", str(tmp_path / "b.bundle"), "--all"], cwd=clone, check=True
    )
    out = tmp_path / "dirty"
    write_taskset(out, good + bad, {repo: tmp_path / "b.bundle"}, source="test")
    return out, good, bad


EXPECTED_REASONS = [
    ["empty_problem_statement"],
    ["missing_task_branch"],
    ["missing_repo_bundle"],
    ["too_many_tests"],
    ["empty_fail_to_pass"],
    ["unparsable_patch"],
    ["duplicate_instance_id", "duplicate_patch"],  # an exact duplicate: every reason is kept
    ["empty_problem_statement", "missing_task_branch"],
]


def test_each_rule_rejects_with_its_reason(dirty_taskset, tmp_path):
    tasks, good, bad = dirty_taskset
    report = clean_taskset(tasks, tmp_path / "kept", tmp_path / "rejected.jsonl")
    kept = TaskSet.open(tmp_path / "kept")
    assert kept.rows() == good
    assert kept.bundle(good[0]["repo"]).is_file()
    rejected = list(read_jsonl(tmp_path / "rejected.jsonl"))
    assert [r["reject_reasons"] for r in rejected] == EXPECTED_REASONS
    assert [{k: v for k, v in r.items() if k != "reject_reasons"} for r in rejected] == bad
    assert (report.n_in, report.n_kept, report.n_rejected) == (len(good) + len(bad), len(good), len(bad))
    assert report.n_in == report.n_kept + report.n_rejected
    assert report.reasons[RejectReason.EMPTY_PROBLEM_STATEMENT] == 2
    assert report.reasons[RejectReason.MISSING_TASK_BRANCH] == 2
    m = report.metrics()
    assert m["rows_in"] == report.n_in and m["rejected_too_many_tests"] == 1.0
    assert all(isinstance(v, float) for v in m.values())
    md = report.markdown()
    assert (
        "| `duplicate_instance_id` | 1 |" in md and "| `duplicate_patch` | 1 |" in md and "reconciles" in md
    )


def test_thresholds_are_parameters(dirty_taskset, tmp_path):
    tasks, good, bad = dirty_taskset
    params = CleanParams(
        max_tests=1000,
        require_f2p=False,
        require_problem_statement=False,
        check_branches=False,
        drop_duplicates=False,
        require_parsable_patch=False,
    )
    report = clean_taskset(tasks, tmp_path / "kept", tmp_path / "rejected.jsonl", params)
    assert report.n_rejected == 0 and report.n_kept == len(good) + len(bad)
    strict = clean_taskset(tasks, tmp_path / "k2", tmp_path / "r2.jsonl", CleanParams(max_tests=2))
    assert strict.reasons[RejectReason.TOO_MANY_TESTS] > 1


def test_duplicate_patch_under_another_id(synth_taskset, tmp_path):
    src = TaskSet.open(synth_taskset)
    rows = src.rows()
    copy = {**rows[0], "instance_id": "renamed"}
    write_taskset(tmp_path / "ts", rows + [copy], {rows[0]["repo"]: src.bundle(rows[0]["repo"])}, source="t")
    report = clean_taskset(
        tmp_path / "ts", tmp_path / "k", tmp_path / "r.jsonl", CleanParams(check_branches=False)
    )
    assert report.reasons == {"duplicate_patch": 1}


def test_stage_writes_all_artifacts_and_reruns_idempotently(dirty_taskset, tmp_path):
    tasks, good, bad = dirty_taskset
    out = tmp_path / "stage"
    run_clean_stage(tasks, out)
    first = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert sorted(first) == ["metrics.json", "reasons.png", "rejected.jsonl", "report.md"]
    assert first["reasons.png"].startswith(b"\x89PNG")
    assert json.loads(first["metrics.json"])["rows_kept"] == len(good)
    run_clean_stage(tasks, out)
    again = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {k: v for k, v in again.items() if k != "reasons.png"} == {
        k: v for k, v in first.items() if k != "reasons.png"
    }
    assert (out / "kept" / "tasks.jsonl").is_file()


@pytest.mark.parametrize(
    "patch,problem",
    [
        ("", "empty patch"),
        ("just some text\n", "no '@@' hunk"),
        ("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n", "ends inside a hunk"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n", "outside any hunk"),
        ("--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n-a\n+b\n@@ -5 +5 @@\n", "hunk ends before"),
        ("@@ -1 +1 @@\n-a\n+b\n", "before any '+++'"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b", "no newline at the end"),
        ("--- a/x\n+++ b/x\n@@ -x +1 @@\n", "malformed hunk header"),
    ],
)
def test_patch_problems(patch, problem):
    assert problem in patch_problem(patch)


def test_valid_patches_pass(synth_taskset):
    for r in TaskSet.open(synth_taskset).rows():
        assert patch_problem(r["patch"]) is None
    no_newline = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n"
    assert patch_problem(no_newline) is None


def test_planted_rejections_at_small_scale(tmp_path):
    """The benchmark generator's planted bad rows are exactly what clean rejects (400 rows, 4 repos)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "make_swesmith_rows.py"
    spec = importlib.util.spec_from_file_location("make_swesmith_rows", path)
    assert spec is not None and spec.loader is not None, path
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--out", str(tmp_path / "ts"), "--rows", "400", "--repos", "4", "--seed", "3"]) == 0
    manifest = TaskSet.open(tmp_path / "ts").manifest
    expected = manifest["expected_rejections"]
    report = clean_taskset(tmp_path / "ts", tmp_path / "kept", tmp_path / "rejected.jsonl")
    assert sum(expected.values()) > 0 and expected["duplicate_patch"] == expected["duplicate_instance_id"] > 0
    assert dict(report.reasons) == {k: v for k, v in expected.items() if v}
    assert report.n_rejected == manifest["expected_rejected_rows"] and report.n_in == 400
