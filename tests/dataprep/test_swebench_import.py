"""`harnessrl tasks import` on SWE-bench-format rows (tests/fixtures/swebench, made from parse 1.22.4): every row
becomes a runnable task or a rejected row with a one-line reason; clean then keeps the converted rows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from harnessrl.cli import main
from harnessrl.io import read_jsonl
from harnessrl.taskset import TaskSet
from tests.support.fixtures import SWEBENCH_EXAMPLE

ROWS = SWEBENCH_EXAMPLE / "rows.jsonl"
MIRRORS = SWEBENCH_EXAMPLE / "mirrors"
PUBLIC_FIELDS = {
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
}


def fixture_rows() -> list[dict]:
    return list(read_jsonl(ROWS))


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_fixture_rows_have_the_public_schema():
    rows = fixture_rows()
    assert len(rows) == 3
    for r in rows:
        assert set(r) == PUBLIC_FIELDS and all(isinstance(v, str) for v in r.values())
        f2p, p2p = json.loads(r["FAIL_TO_PASS"]), json.loads(r["PASS_TO_PASS"])
        assert f2p and p2p and not set(f2p) & set(p2p)
        assert r["test_patch"].startswith("diff --git a/tests/") and "tests/" not in r["patch"]
        # easy tier: the statement names the file and the function
        assert "`parse/__init__.py`" in r["problem_statement"]


def test_import_then_clean_keeps_every_swebench_row(tmp_path, capsys):
    """Before: import copied the upstream mirror and clean rejected every row as missing_task_branch."""
    out = tmp_path / "tasks"
    assert main(["tasks", "import", str(ROWS), "--repos", str(MIRRORS), "--out", str(out)]) == 0
    assert main(["stage", "clean", "--tasks", str(out), "--out", str(tmp_path / "clean")]) == 0
    metrics = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    assert metrics["rejected_missing_task_branch"] == 0 and metrics["rows_kept"] == 3
    assert "3 SWE-bench rows converted, 0 rejected" in capsys.readouterr().out
    ts = TaskSet.open(out)
    assert [r["instance_id"] for r in ts.rows()] == [r["instance_id"] for r in fixture_rows()]
    assert ts.rows()[0]["FAIL_TO_PASS"] == json.loads(fixture_rows()[0]["FAIL_TO_PASS"])
    assert (out / "rejects.jsonl").read_text() == ""
    # the task branch holds the base commit's tree, with no history
    repo = ts.rows()[0]["repo"]
    bundle = str(ts.bundle(repo))
    heads = subprocess.run(["git", "bundle", "list-heads", bundle], capture_output=True, text=True).stdout
    assert "refs/heads/pr-" not in heads  # the upstream branches (with the fixes) stay out


def test_every_unconvertible_row_is_rejected_with_a_one_line_reason(tmp_path, capsys):
    good, other, third = fixture_rows()
    missing_field = {k: v for k, v in other.items() if k != "test_patch"}
    bad_json = {**third, "FAIL_TO_PASS": "[not json"}
    unknown_repo = {**other, "instance_id": "someone__else-1", "repo": "someone/else"}
    no_base = {**other, "instance_id": "x__y-2", "base_commit": "0123456789" * 4}
    bad_patch = {
        **other,
        "instance_id": "x__y-3",
        "patch": good["patch"].replace("number_start", "nope_start"),
    }
    duplicate = dict(good)
    django_ids = {**other, "instance_id": "x__y-4", "FAIL_TO_PASS": '["test_x (admin.tests.AdminTests)"]'}
    data = write_rows(
        tmp_path / "rows.jsonl",
        [good, missing_field, bad_json, unknown_repo, no_base, bad_patch, duplicate, "{oops", django_ids],
    )
    # the mirror as a plain clone given with --repo-dir
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", str(MIRRORS / "harnessrl-examples__parse.bundle"), str(clone)], check=True
    )
    out = tmp_path / "tasks"
    rc = main(
        ["tasks", "import", str(data), "--repo-dir", f"harnessrl-examples/parse={clone}", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "1 SWE-bench rows converted, 8 rejected" in captured.out
    assert [r["instance_id"] for r in TaskSet.open(out).rows()] == [good["instance_id"]]
    rejects = {(r["where"], r["reason"]) for r in read_jsonl(out / "rejects.jsonl")}
    assert rejects == {
        (f"{data}:2", "missing_field"),
        (f"{data}:3", "bad_field"),
        (f"{data}:4", "unknown_repo"),
        (f"{data}:5", "base_commit_not_found"),
        (f"{data}:6", "patch_does_not_apply"),
        (f"{data}:7", "duplicate_instance_id"),
        (f"{data}:8", "malformed_row"),
        (f"{data}:9", "unsupported_test_ids"),
    }
    err = captured.err.splitlines()
    assert "Traceback" not in captured.err
    assert any("missing repo someone/else" in e and "--repo-dir someone/else=PATH" in e for e in err)
    lines = [e for e in err if e.startswith("  rejected ")]
    assert len(lines) == 8
    assert any(f"{data}:2 " in e and "missing field(s) test_patch" in e for e in lines)
    assert any(f"{data}:3 " in e and "FAIL_TO_PASS: a string that is not a JSON list" in e for e in lines)
    assert any("base_commit 0123456789" in e and "is not in the mirror" in e for e in lines)


def test_no_mirror_at_all_converts_nothing_and_says_how_to_supply_one(tmp_path, capsys):
    rc = main(["tasks", "import", str(ROWS), "--repos", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "missing repo harnessrl-examples/parse: no local mirror" in err
    assert "--repo-dir harnessrl-examples/parse=PATH" in err
    assert len(list(read_jsonl(tmp_path / "out" / "rejects.jsonl"))) == 3


def test_swe_gym_parquet_with_list_columns_imports(tmp_path):
    """SWE-Gym's shape: FAIL_TO_PASS / PASS_TO_PASS as list columns, no environment_setup_commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dataprep.load import import_taskset

    rows = [
        {
            **{k: v for k, v in r.items() if k != "environment_setup_commit"},
            "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"]),
            "PASS_TO_PASS": json.loads(r["PASS_TO_PASS"]),
        }
        for r in fixture_rows()
    ]
    data = tmp_path / "swe_gym.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    ts = import_taskset(data, MIRRORS, tmp_path / "tasks")
    assert ts.manifest["import"]["format"] == "swebench" and ts.manifest["import"]["converted"] == 3
    assert [r["FAIL_TO_PASS"] for r in ts.rows()] == [r["FAIL_TO_PASS"] for r in rows]
