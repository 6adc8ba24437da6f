"""The run summary: rounds accumulate from one summary step to the next, pass rates and links are right."""

import json
from pathlib import Path

from kfp.dsl import Metrics

from components.summarize_run.stage import ROUNDS_FILE, RoundRecord, StageRef, read_metrics, run_summary
from harnessrl.reports import extract_pngs

DIFFICULTY = StageRef("estimate-difficulty", "/runs/x/estimate-difficulty/metrics", {"tasks": 10, "n": 4})
DIFFICULTY.values.update({"valid_rollouts": 40, "passes": 10, "mixed": 6, "all_pass": 2, "all_fail": 2})
SELECTION = StageRef("select", "/runs/x/select/metrics", {"train": 7, "test": 1})


def a_round(r: int, resolved: int, root: str = "/runs/x") -> RoundRecord:
    suffix = "" if r == 1 else f"-{r}"
    return RoundRecord(
        r,
        StageRef("generate-rollouts", f"{root}/generate-rollouts{suffix}/metrics", {"rollouts": 28}),
        StageRef("verify", f"{root}/verify{suffix}/metrics", {"graded": 28, "resolved": resolved}),
        StageRef("train-grpo", f"{root}/train-grpo{suffix}/metrics", {"loss_first": 0.5, "loss": 0.25}),
    )


def test_rounds_accumulate_and_a_rerun_round_replaces_itself(tmp_path):
    first = run_summary(DIFFICULTY, SELECTION, a_round(1, 7), None, tmp_path / "s1", total_rounds=2)
    assert first.markdown.startswith("# Run summary (round 1 of 2)")
    assert first.metrics["pass_rate_base"] == 0.25 and first.metrics["pass_rate_last_round"] == 0.25
    second = run_summary(
        DIFFICULTY, SELECTION, a_round(2, 14), tmp_path / "s1", tmp_path / "s2", total_rounds=2
    )
    assert second.markdown.startswith("# Run summary (all rounds)")
    assert (
        "Pass rate 25.0% before training" in second.markdown
        and "→ 50.0% in round 2's rollouts" in second.markdown
    )
    assert second.metrics["rounds"] == 2 and second.metrics["tasks_selected"] == 7
    assert [
        json.loads(line)["round"] for line in (tmp_path / "s2" / ROUNDS_FILE).read_text().splitlines()
    ] == [1, 2]
    again = run_summary(
        DIFFICULTY, SELECTION, a_round(2, 21), tmp_path / "s1", tmp_path / "s2", total_rounds=2
    )
    assert again.metrics["pass_rate_last_round"] == 0.75 and again.metrics["rounds"] == 2
    assert len(extract_pngs(again.markdown)) == 1
    assert "| 2 | n/a | 0.5 → 0.25 | 28 |" in again.markdown


def test_links_point_into_the_local_reports_folder_or_name_the_cluster_artifact(tmp_path):
    local = run_summary(DIFFICULTY, SELECTION, a_round(1, 7), None, tmp_path / "a", total_rounds=1)
    assert "[estimate-difficulty](estimate-difficulty.html)" in local.markdown
    assert "[verify](verify.html)" in local.markdown
    remote = a_round(1, 7, root="s3://bucket/root/harnessrl-full/run-1")
    on_cluster = run_summary(DIFFICULTY, SELECTION, remote, None, tmp_path / "b", total_rounds=1)
    assert "verify: `s3://bucket/root/harnessrl-full/run-1/verify/report_html`" in on_cluster.markdown


def test_metrics_are_read_from_metadata_else_from_the_file(tmp_path):
    logged = Metrics(uri=str(tmp_path / "m1"))
    logged.log_metric("resolved", 3.0)
    assert read_metrics(logged, "verify").values == {"resolved": 3.0}
    written = Metrics(uri=str(tmp_path / "m2"))
    Path(written.path).write_text(json.dumps({"graded": 4, "note": "text", "ok": True}))
    ref = read_metrics(written, "verify")
    assert ref.values == {"graded": 4.0} and ref.uri == str(tmp_path / "m2")
