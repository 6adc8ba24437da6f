"""The verify stage: many rollouts in parallel, its output dataset, the CLI, and a real kfp.local run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.sandbox.workspace import RepoCache
from harnessrl.verify.rollouts import run_verify
from tests.support.fixtures import requires_bwrap

pytestmark = requires_bwrap


def _gold_diff(task, tmp_path: Path) -> str:
    ws = task.workspace(tmp_path / "gold-ws")
    task.apply_gold(ws)
    cache = RepoCache.for_repo(task.taskset, task.row["repo"])
    return cache.diff_worktree(cache.task_tip(task.iid), ws).decode()


@pytest.fixture(scope="module")
def stage_run(task, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage")
    gold = _gold_diff(task, tmp)
    ws_gold = task.workspace(tmp / "rollouts" / "ws-gold")
    task.apply_gold(ws_gold)
    (ws_gold / "conftest.py").write_text("# harmless but forbidden\n")
    rows = [
        {"rollout_id": "r-gold-ws", "instance_id": task.iid, "workspace": "ws-gold"},  # relative to the file
        {"rollout_id": "r-gold-abs-ws", "instance_id": task.iid, "workspace": str(ws_gold)},
        {
            "rollout_id": "r-gold-model-patch",
            "instance_id": task.iid,
            "model_patch": gold,
            "rollout_status": "timeout",
        },
        {
            "rollout_id": "r-bad-patch",
            "instance_id": task.iid,
            "patch": "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        },
        {"rollout_id": "r-infra", "instance_id": task.iid, "rollout_status": "infra_error"},
        {"rollout_id": "r-unknown", "instance_id": "no-such-task", "patch": ""},
        {"rollout_id": "r-missing-ws", "instance_id": task.iid, "workspace": "nope"},
    ]
    write_jsonl(tmp / "rollouts" / "rollouts.jsonl", rows)
    out = tmp / "verified"
    summary = run_verify(task.taskset.root, tmp / "rollouts", out, workers=2, timeout_s=120)
    return tmp, out, summary


def test_stage_output_dataset(stage_run):
    tmp, out, summary = stage_run
    rows = {r["rollout_id"]: r for r in read_jsonl(out / "rewards.jsonl")}
    assert list(rows) == [
        "r-gold-ws",
        "r-gold-abs-ws",
        "r-gold-model-patch",
        "r-bad-patch",
        "r-infra",
        "r-unknown",
        "r-missing-ws",
    ]  # input order
    assert (rows["r-gold-ws"]["reward"], rows["r-gold-ws"]["verify_status"], rows["r-gold-ws"]["status"]) == (
        1.0,
        "resolved",
        "ok",
    )
    assert rows["r-gold-ws"]["flagged"] and rows["r-gold-ws"]["dropped"][0]["path"] == "conftest.py"
    assert rows["r-gold-abs-ws"]["reward"] == 1.0
    # graded, but the harness timed out: the rollout's status is kept for the trainer to decide
    assert (rows["r-gold-model-patch"]["reward"], rows["r-gold-model-patch"]["status"]) == (1.0, "timeout")
    assert (rows["r-bad-patch"]["reward"], rows["r-bad-patch"]["verify_status"]) == (0.0, "apply_failed")
    for rid in ("r-infra", "r-unknown", "r-missing-ws"):  # never a silent 0
        assert rows[rid]["reward"] is None and rows[rid]["status"] == "infra_error", rows[rid]
    assert "not in the task set" in rows["r-unknown"]["detail"]
    assert summary["resolved"] == 3 and summary["graded"] == 4 and summary["infra_errors"] == 3
    assert "passed" in (out / "logs" / "r-gold-ws.log").read_text()
    assert (out / "status_counts.png").read_bytes().startswith(b"\x89PNG")
    assert "| r-gold-ws |" in (out / "report.md").read_text()
    assert json.loads((out / "summary.json").read_text()) == summary


def test_stage_rerun_is_idempotent_and_bad_input_is_clear(stage_run, task, tmp_path, capsys):
    tmp, out, _ = stage_run
    rollouts = tmp_path / "r.jsonl"
    write_jsonl(
        rollouts,
        [
            {"rollout_id": "a", "instance_id": task.iid, "rollout_status": "infra_error"},
            {"rollout_id": "b", "instance_id": "unknown", "patch": ""},
        ],
    )
    again = tmp_path / "again"
    first = run_verify(task.taskset.root, rollouts, again, workers=2)
    (again / "stale.txt").write_text("x")
    second = run_verify(task.taskset.root, rollouts, again, workers=2)
    assert not (again / "stale.txt").exists()  # the output directory is replaced whole
    assert {k: v for k, v in first.items() if "wall" not in k and "per_min" not in k} == {
        k: v for k, v in second.items() if "wall" not in k and "per_min" not in k
    }
    assert [r["reward"] for r in read_jsonl(again / "rewards.jsonl")] == [None, None]

    (out / "stale.txt").write_text("x")
    code = main(
        ["stage", "verify", "--tasks", str(tmp / "no-tasks"), "--rollouts", str(rollouts), "--out", str(out)]
    )
    assert code == 2 and "not a task-set directory" in capsys.readouterr().err
    assert (out / "stale.txt").exists()  # a failed run leaves the previous output alone


@pytest.mark.parametrize(
    "second, message",
    [
        ({"rollout_id": "b", "instance_id": "x"}, "row 2 (b): needs one of"),
        ({"rollout_id": "a", "instance_id": "x", "patch": ""}, "row 2: duplicate rollout_id 'a'"),
        ({"rollout_id": "c", "patch": ""}, "row 2: missing 'instance_id'"),
    ],
)
def test_rollouts_file_errors_name_the_row(task, tmp_path, capsys, second, message):
    rollouts = tmp_path / "r.jsonl"
    write_jsonl(rollouts, [{"rollout_id": "a", "instance_id": task.iid, "patch": ""}, second])
    code = main(
        [
            "stage",
            "verify",
            "--tasks",
            str(task.taskset.root),
            "--rollouts",
            str(rollouts),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists()


def test_verify_cli_prints_a_json_report(task, tmp_path):
    patch = tmp_path / "fix.diff"
    patch.write_text(_gold_diff(task, tmp_path))
    exe = [
        str(Path(sys.executable).parent / "harnessrl"),
        "verify",
        "--tasks",
        str(task.taskset.root),
        "--instance",
        task.iid,
    ]
    p = subprocess.run([*exe, "--patch", str(patch)], capture_output=True, text=True, timeout=300)
    report = json.loads(p.stdout)
    assert p.returncode == 0, p.stderr
    assert report["status"] == "resolved" and report["resolved"] is True and report["reward"] == 1.0
    assert report["dropped"] == [] and all(t["ok"] for t in report["tests"].values())
    empty = tmp_path / "empty.diff"
    empty.write_text("")
    p = subprocess.run([*exe, "--patch", str(empty)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and json.loads(p.stdout)["reward"] == 0.0  # graded, reward 0: still exit 0
    p = subprocess.run([*exe, "--patch", str(tmp_path / "missing.diff")], capture_output=True, text=True)
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr


def test_verify_cli_infra_error_exits_nonzero(task, tmp_path, capsys, monkeypatch):
    # a sandbox that cannot start (bwrap refuses a bogus mount) is an infrastructure error: exit 1
    from harnessrl.sandbox import bwrap

    monkeypatch.setattr(
        bwrap.BubblewrapSandbox, "_ro_paths", lambda self: [Path("/nonexistent-harnessrl-path")]
    )
    ws = task.workspace(tmp_path / "ws")
    (ws / "NOTES.txt").write_text("a change, so that the tests run\n")  # an empty patch needs no sandbox
    code = main(["verify", "--tasks", str(task.taskset.root), "--instance", task.iid, "--workspace", str(ws)])
    captured = capsys.readouterr()
    assert code == 1 and json.loads(captured.out)["status"] == "infra_error"
    assert "infrastructure error" in captured.err


def test_kfp_local_run_of_the_verify_component(task, stage_run, tmp_path):
    from kfp import dsl, local

    from components.verify.component import verify

    tmp, _, _ = stage_run
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    write_jsonl(
        rollouts / "rollouts.jsonl",
        [
            {"rollout_id": "kfp-gold", "instance_id": task.iid, "model_patch": _gold_diff(task, tmp_path)},
            {"rollout_id": "kfp-infra", "instance_id": task.iid, "rollout_status": "infra_error"},
        ],
    )

    @dsl.pipeline(name="verify-only")
    def verify_only(tasks_uri: str, rollouts_uri: str):
        tasks = dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset, reimport=False)
        rolls = dsl.importer(artifact_uri=rollouts_uri, artifact_class=dsl.Dataset, reimport=False)
        verify(tasks=tasks.output, rollouts=rolls.output, workers=2, timeout_s=120.0)

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        raise_on_error=True,
    )
    verify_only(tasks_uri=str(task.taskset.root), rollouts_uri=str(rollouts))
    rewards = list((tmp_path / "root").rglob("rewards.jsonl"))
    assert len(rewards) == 1
    by_id = {r["rollout_id"]: r["reward"] for r in read_jsonl(rewards[0])}
    assert by_id == {"kfp-gold": 1.0, "kfp-infra": None}
    metrics = next(p for p in (tmp_path / "root").rglob("metrics") if p.is_file())
    assert json.loads(metrics.read_text())["resolved"] == 1.0
    assert (
        "data:image/png;base64,"
        in next(p for p in (tmp_path / "root").rglob("report") if p.is_file()).read_text()
    )
