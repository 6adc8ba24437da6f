"""The run summary of harnessrl-full reads the evaluate step's real metric names and the loop's steps."""

from components.evaluate.stage import flat_metrics
from components.summarize_run.rl import comparison_rows, evaluation_rows, render_rl_summary
from components.summarize_run.stage import StageRef
from harnessrl.reports import extract_pngs
from harnessrl.rl.records import StepRecord

DIFFICULTY = StageRef("estimate-difficulty", "/runs/x/estimate-difficulty/metrics", {"tasks": 10, "n": 4})
DIFFICULTY.values.update({"valid_rollouts": 40, "passes": 10, "mixed": 6, "all_pass": 2, "all_fail": 2})
SELECTION = StageRef("select", "/runs/x/select/metrics", {"train": 7, "test": 3})
LOOP = StageRef(
    "rl-loop",
    "/runs/x/rl-loop/metrics",
    {"steps_trained": 2, "groups_trained": 2, "reward_first": 0.0, "reward_last": 0.5, "staleness_max": 1},
)


def _result(policy: str, rate: float, low: float, high: float) -> dict:
    return {
        "policy": policy,
        "mode": "sampled",
        "pass_at_1": rate,
        "pass_at_1_ci": [low, high],
        "graded": 12,
        "resolved": round(rate * 12),
        "pass_at_k": {"1": {"value": rate}, "4": {"value": min(1.0, 2 * rate)}},
    }


EVALUATION = {
    "results": [_result("base", 0.25, 0.09, 0.53), _result("trained", 0.5, 0.25, 0.75)],
    "comparisons": [
        {
            "a": "base",
            "b": "trained",
            "mode": "sampled",
            "diff": 0.25,
            "low": -0.1,
            "high": 0.6,
            "significant": False,
        }
    ],
}


def test_evaluation_numbers_are_read_back_from_the_evaluate_steps_metric_names():
    values = flat_metrics(EVALUATION)
    rows = evaluation_rows(values)
    assert [(r["policy"], r["pass_at_1"], r["low"], r["high"]) for r in rows] == [
        ("base", 0.25, 0.09, 0.53),
        ("trained", 0.5, 0.25, 0.75),
    ]
    [c] = comparison_rows(values)
    assert (c["b"], c["a"], c["diff"], c["low"], c["high"], c["significant"]) == (
        "trained",
        "base",
        0.25,
        -0.1,
        0.6,
        False,
    )


def _trained(step: int, reward: float, loss: float) -> StepRecord:
    """A trained step's record as steps.jsonl holds it."""
    return StepRecord.from_row({"step": step, "outcome": "trained", "reward_mean": reward, "loss": loss})


def test_summary_reports_the_loop_and_the_held_out_comparison():
    evaluation = StageRef("evaluate", "/runs/x/evaluate/metrics", flat_metrics(EVALUATION))
    steps = [_trained(1, 0.0, 0.1), _trained(2, 0.5, 0.05)]
    report = render_rl_summary(DIFFICULTY, SELECTION, LOOP, evaluation, steps, "colocated")
    md = report.markdown
    assert md.startswith("# Run summary")
    assert "trained − base (sampled): +0.250 [-0.100, +0.600], not significant" in md
    assert "| base | sampled | 12 | 3 | 25.0% | [9.0%, 53.0%] |" in md
    assert "| colocated | 2 | 2 |" in md and "[evaluate](evaluate.html)" in md
    [(alt, png)] = extract_pngs(md)
    assert "held-out pass@1" in alt and png.startswith(b"\x89PNG")
    assert report.metrics["pass_at_1_base"] == 0.25 and report.metrics["pass_at_1_diff"] == 0.25
    assert report.metrics["pass_rate_base_difficulty"] == 0.25


def test_summary_without_evaluation_numbers_says_so():
    empty = StageRef("evaluate", "/runs/x/evaluate/metrics", {})
    report = render_rl_summary(DIFFICULTY, SELECTION, LOOP, empty, [], "sync")
    assert "n/a (no comparison)" in report.markdown and "pass_at_1_base" not in report.metrics
