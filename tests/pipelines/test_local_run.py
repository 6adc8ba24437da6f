"""`harnessrl run`: real kfp.local runs (SubprocessRunner, this env) of the data-prep pipelines on the
minirepo fixture, the run directory they leave, caching, per-stage reruns by URI, and failures."""

import json
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.taskset import TaskSet
from pipelines.local_run import run_local

REPO = Path(__file__).resolve().parents[2]
MINIREPO = REPO / "tests" / "fixtures" / "minirepo"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow  # real kfp.local runs: ~90 s for the module on 2 cores


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")  # one kfp.local cache (runs_root/.kfp-cache) for the module


@pytest.fixture(scope="module")
def data_prep_run(runs_root):
    result = run_local("data-prep", [f"source_uri={MINIREPO}", "max_tasks=2", "seed=0"], runs_root / "dp")
    return result, json.loads(result.index_path.read_text())


def output(index, task, name):
    return index["tasks"][task]["outputs"][name]


def test_data_prep_run_directory(data_prep_run):
    result, index = data_prep_run
    assert result.status == "succeeded", result.failed_log[-20:]
    assert index["status"] == "succeeded" and index["pipeline"] == "data-prep"
    assert index["arguments"]["source_uri"] == str(MINIREPO)
    assert {"synthesize", "clean", "validate"} <= set(index["tasks"])
    kept = TaskSet.open(output(index, "clean", "kept")["path"])
    synthesized = TaskSet.open(output(index, "synthesize", "tasks")["path"])
    assert 1 <= len(kept.rows()) <= len(synthesized.rows()) <= 2
    clean_metrics = output(index, "clean", "metrics")["values"]
    assert (
        clean_metrics["n_in"]
        == clean_metrics["n_kept"] + clean_metrics["n_rejected"]
        == len(synthesized.rows())
    )
    assert output(index, "validate", "metrics")["values"]["success"] == 1.0
    assert Path(output(index, "validate", "results")["path"]).is_dir()
    # reports: Markdown artifacts with embedded PNGs for the KFP UI, PNG files + index in the run dir
    artifact_md = Path(output(index, "clean", "report")["path"]).read_text()
    assert "data:image/png;base64," in artifact_md
    reports = result.run_dir / "reports"
    assert (reports / "index.md").is_file()
    for stage in ("synthesize", "clean", "validate"):
        md = (reports / f"{stage}.md").read_text()
        assert "base64" not in md
        assert (reports / f"{stage}-0.png").read_bytes().startswith(PNG_MAGIC)
        assert f"({stage}-0.png)" in md
    # the Metrics file is always written (kfp.local only caches steps whose outputs all exist)
    assert Path(output(index, "clean", "metrics")["path"]).is_file()
    assert (result.run_dir / "pipeline.yaml").is_file() and (result.run_dir / "run.log").stat().st_size > 0


def test_rerun_reuses_cached_steps(data_prep_run, runs_root):
    first, _ = data_prep_run
    again = run_local("data-prep", [f"source_uri={MINIREPO}", "max_tasks=2", "seed=0"], runs_root / "dp")
    index = json.loads(again.index_path.read_text())
    assert again.status == "succeeded"
    assert {t: index["tasks"][t]["status"] for t in ("synthesize", "clean", "validate")} == dict.fromkeys(
        ("synthesize", "clean", "validate"), "cached"
    )
    assert output(index, "clean", "kept")["path"] == first.tasks["clean"]["outputs"]["kept"]["path"]


def test_clean_only_imports_tasks_by_uri(data_prep_run, runs_root, capsys):
    _, index = data_prep_run
    tasks_uri = output(index, "synthesize", "tasks")["path"]
    code = main(
        [
            "run",
            "clean-only",
            "--run-dir",
            str(runs_root / "clean-only"),
            "--arg",
            f"tasks_uri={tasks_uri}",
            "--arg",
            "max_tests=1",
            "--no-cache",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "run directory:" in out and "run.json" in out
    again = json.loads((runs_root / "clean-only" / "run.json").read_text())
    metrics = output(again, "clean", "metrics")["values"]
    assert metrics["n_rejected"] >= 1  # every synthesized task has > 1 test
    assert metrics["n_in"] == metrics["n_kept"] + metrics["n_rejected"]
    rejected = [
        json.loads(line) for line in Path(output(again, "clean", "rejected")["path"]).read_text().splitlines()
    ]
    assert all(r["reject_reasons"] for r in rejected)


def test_failed_step_is_reported_with_its_reason(data_prep_run, runs_root, capsys):
    _, index = data_prep_run
    broken = runs_root / "broken-tasks"
    kept = Path(output(index, "clean", "kept")["path"])
    broken.mkdir()
    (broken / "repos").symlink_to(kept / "repos")
    (broken / "manifest.json").write_text((kept / "manifest.json").read_text())
    (broken / "tasks.jsonl").write_text((kept / "tasks.jsonl").read_text() + "{not json\n")
    code = main(["run", "clean-only", "--run-dir", str(runs_root / "c-fail"), "--arg", f"tasks_uri={broken}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "step clean failed" in out and "tasks.jsonl:" in out and "malformed JSON" in out
    failed = json.loads((runs_root / "c-fail" / "run.json").read_text())
    assert failed["status"] == "failed" and failed["failed_task"] == "clean"
    assert any("malformed JSON" in line for line in failed["failed_log_tail"])


def test_bad_run_arguments_are_one_line_errors(capsys, tmp_path):
    assert main(["run", "no-such-pipeline"]) == 2
    assert "neither a registered pipeline" in capsys.readouterr().err
    assert main(["run", "clean-only", "--run-dir", str(tmp_path / "r")]) == 2
    assert "missing required argument(s) ['tasks_uri']" in capsys.readouterr().err
    assert main(["run", "clean-only", "--arg", f"tasks_uri={tmp_path / 'absent'}"]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["run", "clean-only", "--arg", "tasks_uri"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_s3_inputs_are_fetched_for_local_runs(data_prep_run, runs_root, s3_env, capsys):
    """`harnessrl run clean-only --arg tasks_uri=s3://...` on a task set in a real S3 endpoint (moto)."""
    from harnessrl.store import ObjectStore

    store = ObjectStore.from_env()
    store.ensure_bucket("harnessrl")
    _, index = data_prep_run
    store.upload_dir(output(index, "synthesize", "tasks")["path"], "s3://harnessrl/tasks/v1")
    run_dir = runs_root / "clean-from-s3"
    assert (
        main(
            [
                "run",
                "clean-only",
                "--run-dir",
                str(run_dir),
                "--arg",
                "tasks_uri=s3://harnessrl/tasks/v1",
                "--no-cache",
            ]
        )
        == 0
    ), capsys.readouterr().out
    result = json.loads((run_dir / "run.json").read_text())
    assert result["arguments"]["tasks_uri"] == str(run_dir / "inputs" / "tasks_uri" / "v1")
    assert TaskSet.open(run_dir / "inputs" / "tasks_uri" / "v1").rows()
    assert output(result, "clean", "metrics")["values"]["n_in"] >= 1
    assert (
        main(
            [
                "run",
                "clean-only",
                "--run-dir",
                str(runs_root / "x"),
                "--arg",
                "tasks_uri=s3://harnessrl/absent",
            ]
        )
        == 2
    )
    assert "fetching s3://harnessrl/absent" in capsys.readouterr().err
