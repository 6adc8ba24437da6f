import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataprep.load import DataError, import_taskset, load_rows
from harnessrl.taskset import TaskSet, bundle_name


def swesmith_row(i: int = 0, **over) -> dict:
    row = {
        "instance_id": f"pkg.abc1234__func_pm_op_change__{i}",
        "repo": "swesmith/pkg.abc12345",
        "patch": "diff --git a/p.py b/p.py\n--- a/p.py\n+++ b/p.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        "FAIL_TO_PASS": ["tests/test_p.py::test_x"],
        "PASS_TO_PASS": ["tests/test_p.py::test_y", "tests/test_p.py::test_z[1-2]"],
        "image_name": "swesmith.x86_64.pkg.abc12345",
        "problem_statement": "x is wrong",
        "created_at": "2025-01-02T03:04:05",
    }
    row.update(over)
    return row


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_parquet_and_json_give_the_same_rows(tmp_path):
    rows = [swesmith_row(i) for i in range(3)]
    from_jsonl = load_rows(write_lines(tmp_path / "a.jsonl", rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    (tmp_path / "a.json").write_text(json.dumps(rows))
    assert from_jsonl == rows
    assert load_rows(tmp_path / "a.parquet") == rows
    assert load_rows(tmp_path / "a.json") == rows


def test_hf_save_to_disk_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [swesmith_row(i) for i in range(4)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    assert load_rows(tmp_path / "hf") == rows
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:3]), "test": datasets.Dataset.from_list(rows[3:])}
    ).save_to_disk(str(tmp_path / "hfd"))
    assert sorted(r["instance_id"] for r in load_rows(tmp_path / "hfd")) == [r["instance_id"] for r in rows]


def test_swebench_rows_with_json_string_test_lists(tmp_path):
    row = swesmith_row(
        FAIL_TO_PASS=json.dumps(["t.py::a"]),
        PASS_TO_PASS="[]",
        test_patch="diff --git ...",
        base_commit="0" * 40,
        hints_text="",
        version="1.0",
        environment_setup_commit="1" * 40,
    )
    del row["image_name"]
    [loaded] = load_rows(write_lines(tmp_path / "swebench.jsonl", [row]))
    assert loaded["FAIL_TO_PASS"] == ["t.py::a"] and loaded["PASS_TO_PASS"] == []
    assert loaded["test_patch"] == "diff --git ..." and loaded["version"] == "1.0"


def test_parquet_timestamps_become_iso_strings(tmp_path):
    import datetime as dt

    row = swesmith_row(created_at=dt.datetime(2025, 1, 2, 3, 4, 5))
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "t.parquet")
    assert load_rows(tmp_path / "t.parquet")[0]["created_at"] == "2025-01-02T03:04:05"


def test_every_problem_is_listed_with_location_and_field(tmp_path):
    rows = [
        json.dumps(swesmith_row(0)),
        "{not json",
        json.dumps({k: v for k, v in swesmith_row(2).items() if k != "patch"}),
        json.dumps(swesmith_row(3, FAIL_TO_PASS="tests/x.py::t")),
        json.dumps(swesmith_row(4, PASS_TO_PASS=[1, 2])),
        json.dumps(swesmith_row(5, instance_id="")),
        json.dumps(swesmith_row(6, extra_col=1)),
        json.dumps([1, 2]),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError) as err:
        load_rows(path)
    problems = err.value.problems
    assert len(problems) == 7, problems
    expected = [
        (2, "malformed JSON"),
        (3, "missing field 'patch'"),
        (4, "FAIL_TO_PASS: a string that is not"),
        (5, "PASS_TO_PASS: expected a list"),
        (6, "instance_id: expected a non-empty string"),
        (7, "unknown field 'extra_col'"),
        (8, "expected an object"),
    ]
    for (line, text), problem in zip(expected, problems, strict=True):
        assert problem.startswith(f"{path}:{line}: ") and text in problem, problem
    assert str(err.value).startswith(f"7 problem(s) in {path}:")
    assert (
        load_rows(
            path.with_name("ok.jsonl").write_text(rows[6]) and path.with_name("ok.jsonl"), allow_extra=True
        )[0]["extra_col"]
        == 1
    )


def test_empty_missing_and_unsupported_inputs(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no rows"):
        load_rows(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no such file"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type .csv"):
        load_rows(tmp_path / "rows.csv")
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_rows(tmp_path / "x.parquet")


def test_import_from_a_directory_of_bundles(synth_taskset, tmp_path):
    src = TaskSet.open(synth_taskset)
    rows = src.rows()
    orphan = swesmith_row(9, repo="swesmith/gone.00000000")
    data = write_lines(tmp_path / "rows.jsonl", rows + [orphan])
    ts = import_taskset(data, src.root / "repos", tmp_path / "imported")
    assert ts.rows() == rows + [orphan]
    assert ts.bundle(rows[0]["repo"]).read_bytes() == src.bundle(rows[0]["repo"]).read_bytes()
    assert list(ts.manifest["import"]["missing_repos"]) == ["swesmith/gone.00000000"]


def test_import_clones_git_urls(synth_taskset, tmp_path):
    """A `{repo}` URL template over file:// (offline stand-in for https://github.com/{repo}.git)."""
    src = TaskSet.open(synth_taskset)
    rows = src.rows()
    repo = rows[0]["repo"]
    bare = tmp_path / "server" / f"{repo}.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(src.bundle(repo)), str(bare)], check=True)
    data = write_lines(tmp_path / "rows.jsonl", rows)
    ts = import_taskset(data, f"file://{tmp_path}/server/{{repo}}.git", tmp_path / "imported")
    heads = subprocess.run(
        ["git", "bundle", "list-heads", str(ts.bundle(repo))], capture_output=True, text=True, check=True
    ).stdout
    for r in rows:
        assert f"refs/heads/{r['instance_id']}" in heads
    assert (tmp_path / "imported" / "repos" / bundle_name(repo)).is_file()
    assert ts.manifest["import"]["missing_repos"] == {}


def test_import_rejects_bad_repos_argument_and_writes_nothing(tmp_path):
    data = write_lines(tmp_path / "rows.jsonl", [swesmith_row()])
    with pytest.raises(DataError, match="neither a directory of .bundle files nor a git URL"):
        import_taskset(data, tmp_path / "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()
