import json

import pytest

from dataprep.validate import ValidationFailed, validate_taskset
from harnessrl.taskset import TaskSet, write_taskset


def test_synthesized_tasks_pass_the_suite(synth_taskset, tmp_path):
    report = validate_taskset(synth_taskset, tmp_path / "v")
    assert report.success and report.n_rows == len(TaskSet.open(synth_taskset).rows())
    assert report.metrics()["validation_success"] == 1.0
    gx = json.loads((tmp_path / "v" / "gx_results.json").read_text())
    assert gx["success"] is True and len(gx["results"]) == len(report.outcomes) >= 15
    assert "✅ passed" in (tmp_path / "v" / "report.md").read_text()


def test_failures_are_summarized_with_row_ids(synth_taskset, tmp_path):
    rows = TaskSet.open(synth_taskset).rows()
    rows[1]["instance_id"] = rows[0]["instance_id"]
    rows[2]["patch"] = "this is not a diff"
    rows[3]["FAIL_TO_PASS"] = []
    rows.append(
        {
            **rows[0],
            "instance_id": "bad id with spaces",
            "PASS_TO_PASS": rows[0]["FAIL_TO_PASS"],
            "problem_statement": "",
        }
    )
    write_taskset(tmp_path / "ts", rows, {}, source="test")
    with pytest.raises(ValidationFailed) as err:
        validate_taskset(tmp_path / "ts", tmp_path / "v")
    text = str(err.value)
    assert "5 of" in text.splitlines()[0] or "expectations failed" in text.splitlines()[0]
    expected = {
        ("expect_column_values_to_be_unique", "instance_id"): rows[0]["instance_id"],
        ("expect_column_values_to_match_regex", "patch"): rows[2]["instance_id"],
        ("expect_column_values_to_be_between", "n_fail_to_pass"): rows[3]["instance_id"],
        ("expect_column_values_to_match_regex", "instance_id"): "bad id with spaces",
        ("expect_column_values_to_be_in_set", "f2p_p2p_disjoint"): "bad id with spaces",
        ("expect_column_value_lengths_to_be_between", "problem_statement"): "bad id with spaces",
    }
    failed = {(o.expectation, o.column): o for o in err.value.report.failed}
    assert set(failed) == set(expected)
    for key, iid in expected.items():
        assert iid in failed[key].examples
        assert f"{key[0]} on {key[1]}" in text
    assert (tmp_path / "v" / "gx_results.json").is_file()  # written before raising
    assert json.loads((tmp_path / "v" / "metrics.json").read_text())["expectations_failed"] == 6
    report = validate_taskset(tmp_path / "ts", tmp_path / "v2", raise_on_failure=False)
    assert not report.success and "❌" in report.markdown()


def test_missing_columns_fail_readably(tmp_path):
    write_taskset(tmp_path / "ts", [{"instance_id": "a", "repo": "o/r"}], {}, source="test")
    report = validate_taskset(tmp_path / "ts", tmp_path / "v", raise_on_failure=False)
    cols = next(o for o in report.failed if o.expectation == "expect_table_columns_to_match_set")
    assert "missing column patch" in cols.examples
    patch = next(o for o in report.failed if o.column == "patch")
    assert patch.examples == ["the column is missing"]
    assert "the column is missing" in report.summary()
