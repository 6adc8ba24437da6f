"""evaluation.json from the rows the stage reads (generate's rollout rows, verify's reward rows, the gateway's
model calls), built on constructed rows as test_stats.py builds results: held-out groups reported apart
with the whole set's statistics, what each policy's replies looked like, one request answered side by side,
and the report that shows them."""

from __future__ import annotations

import pytest

from components.evaluate.report import render_report
from components.evaluate.stage import EvaluateConfig, build_evaluation, flat_metrics
from harnessrl.evaluate.results import EvalMode, describe, eval_groups, first_replies, score_run, side_by_side
from harnessrl.evaluate.stats import wilson_interval

TRAINED, UNSEEN = "trained kinds", "unseen kinds"
TASKS = [
    {"instance_id": "t1", "repo": "r", "problem_statement": "Write about rivers without commas.", "eval_group": TRAINED},
    {"instance_id": "t2", "repo": "r", "problem_statement": "Describe a forest in lowercase.", "eval_group": TRAINED},
    {"instance_id": "t3", "repo": "r", "problem_statement": "List three birds as JSON.", "eval_group": UNSEEN},
    {"instance_id": "t4", "repo": "r", "problem_statement": "End with the phrase 'That is all.'", "eval_group": UNSEEN},
]  # fmt: skip


def _rows(policy: str, passes: dict[str, list[bool]]) -> tuple[list[dict], list[dict]]:
    rollouts, rewards = [], []
    for iid, outcomes in passes.items():
        for j, ok in enumerate(outcomes):
            rid = f"{iid}__r{j}"
            rollouts.append(
                {"rollout_id": rid, "instance_id": iid, "repo": "r", "sample_index": j,
                 "finish_reason": "submitted", "final_answer": f"{policy} answers {iid} ({j})"}
            )  # fmt: skip
            status = "resolved" if ok else "unresolved"
            parts = {"no_commas#0": float(ok), "on_task": 1.0}
            rewards.append(
                {"rollout_id": rid, "verify_status": status, "reward": float(ok), "reward_parts": parts}
            )
    return rollouts, rewards


# base: 1 of 8 (t2 once); trained: 5 of 8 (t1, t2 always, t4 once)
BASE = {"t1": [False, False], "t2": [True, False], "t3": [False, False], "t4": [False, False]}
FINAL = {"t1": [True, True], "t2": [True, True], "t3": [False, False], "t4": [True, False]}
BASE_CALLS = [{"completion_ids": [4, 4, 4, 4], "finish_reason": "length"}]  # 3 bigrams, 1 distinct
FINAL_CALLS = [
    {"completion_ids": [1, 2], "finish_reason": "stop"},
    {"completion_ids": [3], "finish_reason": "stop"},
]


def _evaluation(tasks: list[dict]) -> dict:
    cfg = EvaluateConfig(k=2, bootstrap_iterations=2000)
    results, firsts = [], {}
    for policy, passes, calls in (("base", BASE, BASE_CALLS), ("trained", FINAL, FINAL_CALLS)):
        rollouts, rewards = _rows(policy, passes)
        results.append(score_run(rollouts, rewards, policy, EvalMode.SAMPLED, 2, calls))
        firsts[policy, "sampled"] = first_replies(rollouts, rewards)
    return build_evaluation("held_out/", tasks, cfg, [], results, firsts)


def test_two_held_out_groups_get_the_whole_sets_statistics_apart(tmp_path):
    evaluation = _evaluation(TASKS)
    # the whole set stays as it is: 1/8 vs 5/8; per-task differences 1, 0.5, 0, 0.5
    base, final = evaluation["results"]
    assert (base["pass_at_1"], final["pass_at_1"]) == (1 / 8, 5 / 8)
    [whole] = evaluation["comparisons"]
    assert (whole["tasks"], whole["diff"]) == (4, 0.5)

    trained, unseen = evaluation["groups"]
    assert (trained["group"], trained["tasks"], unseen["group"], unseen["tasks"]) == (TRAINED, 2, UNSEEN, 2)
    assert [(r["policy"], r["graded"], r["resolved"], r["pass_at_1"]) for r in trained["results"]] == [
        ("base", 4, 1, 0.25),
        ("trained", 4, 4, 1.0),
    ]
    assert trained["results"][0]["pass_at_1_ci"] == list(wilson_interval(1, 4))
    assert [(r["policy"], r["resolved"], r["pass_at_1"]) for r in unseen["results"]] == [
        ("base", 0, 0.0),
        ("trained", 1, 0.25),
    ]
    # paired over the group's tasks: differences (1, 0.5) resample to means 1, 0.75, 0.5 -> [0.5, 1];
    # (0, 0.5) -> [0, 0.5], which holds 0
    [on_trained] = trained["comparisons"]
    assert (on_trained["a"], on_trained["b"], on_trained["tasks"], on_trained["diff"]) == (
        "base",
        "trained",
        2,
        0.75,
    )
    assert (on_trained["low"], on_trained["high"], on_trained["significant"]) == (0.5, 1.0, True)
    [on_unseen] = unseen["comparisons"]
    assert (on_unseen["diff"], on_unseen["low"], on_unseen["high"], on_unseen["significant"]) == (
        0.25,
        0.0,
        0.5,
        False,
    )
    assert "per_task" not in trained["results"][0]  # the whole set's results keep the per-task rows

    report = render_report(evaluation, tmp_path)
    assert f"## Held-out group `{TRAINED}` (2 tasks)" in report and f"## Held-out group `{UNSEEN}`" in report
    assert "| `trained` | sampled | 1.000 [" in report and f"- {describe(on_trained)}" in report


def test_each_policys_replies_and_one_request_side_by_side(tmp_path):
    evaluation = _evaluation(TASKS)
    base, final = evaluation["results"]
    assert (base["mean_reply_tokens"], base["length_finish_share"], base["distinct_2"]) == (4.0, 1.0, 1 / 3)
    assert (final["mean_reply_tokens"], final["length_finish_share"], final["distinct_2"]) == (1.5, 0.0, 1.0)
    metrics = flat_metrics(evaluation)
    assert metrics["base_sampled_mean_reply_tokens"] == 4.0 and metrics["trained_sampled_distinct_2"] == 1.0

    # t1 is the first task whose first rollouts differ in reward (base 0, trained 1)
    example = evaluation["example"]
    assert (example["instance_id"], example["mode"]) == ("t1", "sampled")
    assert example["request"] == "Write about rivers without commas."
    assert [(r["policy"], r["rollout_id"], r["reward"], r["answer"]) for r in example["replies"]] == [
        ("base", "t1__r0", 0.0, "base answers t1 (0)"),
        ("trained", "t1__r0", 1.0, "trained answers t1 (0)"),
    ]
    report = render_report(evaluation, tmp_path)
    assert "| `base` | sampled | 4.0 | 100.0% | 0.333 |" in report
    assert "Write about rivers without commas." in report and "**trained** (reward 1):" in report


def test_each_reward_part_per_policy_says_which_constraints_its_replies_met(tmp_path):
    evaluation = _evaluation(TASKS)
    base, final = evaluation["results"]
    assert base["reward_parts"] == {"no_commas": 1 / 8, "on_task": 1.0}
    assert final["reward_parts"] == {"no_commas": 5 / 8, "on_task": 1.0}
    report = render_report(evaluation, tmp_path)
    assert "## Reward parts" in report and "| `no_commas` | 12.5% | 62.5% |" in report


def test_one_group_is_no_grouping(tmp_path):
    ungrouped = [{k: v for k, v in t.items() if k != "eval_group"} for t in TASKS]
    evaluation = _evaluation(ungrouped)
    assert evaluation["groups"] == [] and "## Held-out group" not in render_report(evaluation, tmp_path)
    same = [{**t, "eval_group": TRAINED} for t in TASKS]
    assert _evaluation(same)["groups"] == []


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        pytest.param([None, None], {}, id="none-named"),
        pytest.param([TRAINED, TRAINED], {}, id="one-group"),
        pytest.param([TRAINED, UNSEEN], {"a": TRAINED, "b": UNSEEN}, id="two-groups"),
        pytest.param([TRAINED, None], {"a": TRAINED, "b": "other"}, id="unnamed-is-other"),
        pytest.param([None, ""], {}, id="empty-is-unnamed"),
    ],
)
def test_eval_groups(groups: list[str | None], expected: dict[str, str]):
    rows = [
        {"instance_id": iid, **({"eval_group": g} if g is not None else {})}
        for iid, g in zip("ab", groups, strict=True)
    ]
    assert eval_groups(rows) == expected


def _first(reward: float | None) -> dict:
    return {"rollout_id": "x", "reward": reward, "answer": "..."}


def test_the_example_is_the_first_task_whose_rewards_differ_else_the_first():
    base = {"t1": _first(0.0), "t2": _first(None), "t3": _first(0.0)}
    final = {"t1": _first(0.0), "t2": _first(1.0), "t3": _first(1.0)}
    request = {"t1": "one", "t2": "two", "t3": "three"}.__getitem__
    # t2's base rollout was not graded: no difference is read into it
    differ, same = (side_by_side({"base": base, "final": f}, request, "sampled") for f in (final, base))
    assert differ is not None and (differ["instance_id"], differ["request"]) == ("t3", "three")
    assert same is not None and same["instance_id"] == "t1"
    assert side_by_side({"base": base}, request, "sampled") is None
    assert side_by_side({"base": base, "final": {"t9": _first(1.0)}}, request, "sampled") is None
