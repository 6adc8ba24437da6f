"""The run summary of harnessrl-full reads the evaluate step's real metric names and the loop's steps."""

from components.evaluate.stage import flat_metrics
from components.summarize_run.rl import comparison_rows, evaluation_rows, render_rl_summary
from components.summarize_run.stage import StageRef
from harnessrl.evaluate.results import EXAMPLE_CHARS, first_replies, side_by_side
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


def _kept(policy: str, answer: str, reward: float) -> dict:
    """What evaluate keeps of a policy's rollouts of one task (its rollout rows and verify's rows), as
    `first_replies` reads them."""
    rollouts = [
        {
            "rollout_id": f"if-1__r{j}",
            "instance_id": "if-1",
            "sample_index": j,
            "final_answer": f"{answer} {j}",
        }
        for j in (1, 0)
    ]
    rewards = [{"rollout_id": f"if-1__r{j}", "reward": reward} for j in (0, 1)]
    return first_replies(rollouts, rewards)


def test_summary_shows_one_held_out_request_answered_by_base_and_trained():
    """The summary shows evaluation.json's side-by-side request: each policy's first rollout's reply (long
    ones clipped) and its reward; the RL loop's replies at the first and the last step beside its table."""
    long_reply = "Rivers run, and run, and run" * 200
    firsts = {
        "base": _kept("base", long_reply, 0.0),
        "trained": _kept("trained", "A river bends slowly", 1.0),
    }
    example = side_by_side(firsts, {"if-1": "Describe a river. Use no commas."}.__getitem__, "sampled")
    loop = StageRef(
        "rl-loop",
        LOOP.uri,
        {**LOOP.values, "mean_reply_tokens_first": 120.0, "mean_reply_tokens_last": 30.0,
         "length_finish_share_first": 0.5, "length_finish_share_last": 0.0, "distinct_2_first": 0.6,
         "distinct_2_last": 0.9},
    )  # fmt: skip
    evaluation = StageRef("evaluate", "/runs/x/evaluate/metrics", flat_metrics(EVALUATION))
    md = render_rl_summary(
        DIFFICULTY, SELECTION, loop, evaluation, [], "colocated", evaluation_json={"example": example}
    ).markdown
    section = md.split("## One held-out request, base and trained\n")[1].split("\n## ")[0]
    assert "Task `if-1` (sampled;" in section and "Describe a river. Use no commas." in section
    base_at, trained_at = section.index("**base** (reward 0):"), section.index("**trained** (reward 1):")
    assert base_at < trained_at and "A river bends slowly 0" in section[trained_at:]  # the first rollout's
    assert "characters cut" in section[base_at:trained_at] and len(section) < 3 * EXAMPLE_CHARS
    assert (
        "Replies, first → last step: 120.0 → 30.0 sampled tokens per model call, 50.0% → 0.0% cut by "
        "max_tokens, distinct-2 0.600 → 0.900." in md
    )


def test_summary_without_the_evaluation_file_or_an_example_says_so():
    evaluation = StageRef("evaluate", "/runs/x/evaluate/metrics", flat_metrics(EVALUATION))
    without = render_rl_summary(DIFFICULTY, SELECTION, LOOP, evaluation, [], "sync").markdown
    assert "The evaluation file (evaluation.json) was not given to this step." in without
    assert "Replies, first → last step: n/a → n/a" in without
    nothing = render_rl_summary(
        DIFFICULTY, SELECTION, LOOP, evaluation, [], "sync", evaluation_json={"example": None}
    ).markdown
    assert "No request was answered by two policies" in nothing
