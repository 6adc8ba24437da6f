import json

from harnessrl.cli import main
from harnessrl.taskset import TaskSet, write_taskset


def test_import_clean_validate_commands(synth_taskset, tmp_path, capsys):
    src = TaskSet.open(synth_taskset)
    data = tmp_path / "rows.jsonl"
    data.write_text((synth_taskset / "tasks.jsonl").read_text())
    assert (
        main(
            [
                "tasks",
                "import",
                str(data),
                "--repos",
                str(src.root / "repos"),
                "--out",
                str(tmp_path / "imported"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "stage",
                "clean",
                "--tasks",
                str(tmp_path / "imported"),
                "--out",
                str(tmp_path / "clean"),
                "--max-tests",
                "200",
            ]
        )
        == 0
    )
    assert "reconciles" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    assert metrics["rows_in"] == metrics["rows_kept"] == len(src.rows())
    assert (
        main(
            ["stage", "validate", "--tasks", str(tmp_path / "clean" / "kept"), "--out", str(tmp_path / "val")]
        )
        == 0
    )
    assert (tmp_path / "val" / "gx_results.json").is_file()

    write_taskset(tmp_path / "bad", [{**src.rows()[0], "FAIL_TO_PASS": []}], {}, source="t")
    assert main(["stage", "validate", "--tasks", str(tmp_path / "bad"), "--out", str(tmp_path / "v2")]) == 1
    err = capsys.readouterr().err
    assert "expect_column_values_to_be_between on n_fail_to_pass: 1 row(s)" in err


def test_bad_input_is_one_clear_error_without_traceback(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"instance_id": "a"}\n{oops\n')
    rc = main(["tasks", "import", str(data), "--repos", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"harnessrl: error: 6 problem(s) in {data}:")  # 5 missing fields + bad JSON
    assert f"{data}:1: missing field 'repo'" in err and f"{data}:2: malformed JSON" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    rc = main(["tasks", "synthesize", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "no such file or directory" in capsys.readouterr().err
