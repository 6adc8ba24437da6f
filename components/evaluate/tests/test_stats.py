"""pass@k, the Wilson interval and the paired bootstrap against hand-computed and published values."""

from __future__ import annotations

import math

import pytest

from harnessrl.evaluate.results import EvalMode, compare, pass_k_values, score_run
from harnessrl.evaluate.stats import paired_bootstrap, pass_at_k, wilson_interval


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 2 / 5),  # pass@1 is the plain fraction
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 2, 4, 1.0),  # n - c < k: every draw holds a correct sample
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
        (10, 1, 5, 1 - 126 / 252),  # 1 - C(9,5)/C(10,5) = 0.5
    ],
)
def test_pass_at_k_small_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_the_binomials_overflow_floats():
    # C(1000, 500) ~ 2.7e299; C(2000, 1000) does not fit a float: the product form never forms it
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - math.comb(197, 100) / math.comb(200, 100), rel=1e-12)
    exact = 1 - math.comb(1990, 1000) / math.comb(2000, 1000)  # Python's exact integers, then one division
    assert pass_at_k(2000, 10, 1000) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    "successes, trials, low, high",
    [  # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (score interval)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (29, 29, 0.8830, 1.0000),
    ],
)
def test_wilson_interval_matches_the_published_worked_examples(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_by_hand_and_edge_cases():
    # 2 of 4, z = 1.96: centre 0.5, half-width 1.96/(1+0.9604) * sqrt(0.0625 + 0.0600) = 0.3500
    z = 1.959963984540054
    half = z / (1 + z * z / 4) * math.sqrt(0.25 / 4 + z * z / 64)
    assert wilson_interval(2, 4) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_paired_bootstrap_clear_improvement_is_significant():
    a = [0.0] * 40 + [1.0] * 10  # resolves 10 of 50
    b = [1.0] * 40 + [1.0] * 10  # resolves all 50: +40 tasks
    r = paired_bootstrap(a, b, iterations=5000, seed=1)
    assert r.diff == pytest.approx(0.8) and r.significant and r.p_value < 0.01
    assert 0.65 < r.low < 0.8 < r.high <= 0.92


def test_paired_bootstrap_balanced_changes_are_not_significant():
    # each policy wins 5 tasks the other loses, 40 ties: the difference is exactly 0
    a = [1.0] * 5 + [0.0] * 5 + [0.5] * 40
    b = [0.0] * 5 + [1.0] * 5 + [0.5] * 40
    r = paired_bootstrap(a, b, iterations=5000, seed=1)
    assert r.diff == 0.0 and not r.significant and r.low < 0 < r.high and r.p_value > 0.5


def test_paired_bootstrap_interval_matches_the_normal_approximation():
    # d_i in {0, 1} with mean 0.5 over 100 tasks: bootstrap SE = sqrt(0.25/100) = 0.05 -> 0.5 ± 0.098
    r = paired_bootstrap([0.0] * 100, [1.0] * 50 + [0.0] * 50, iterations=20_000, seed=3)
    assert r.low == pytest.approx(0.5 - 0.098, abs=0.015) and r.high == pytest.approx(0.5 + 0.098, abs=0.015)
    assert r.significant


def test_paired_bootstrap_is_seeded_and_identical_policies_never_differ():
    a, b = [0.0, 1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 0.0, 0.5, 1.0]
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)
    assert paired_bootstrap(a, b, seed=7) != paired_bootstrap(a, b, seed=8)
    same = paired_bootstrap(a, a, iterations=100)
    assert (same.diff, same.low, same.high, same.significant, same.p_value) == (0.0, 0.0, 0.0, False, 1.0)
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([1.0], [1.0, 0.0])


def _rows(policy_passes: dict[str, list[bool]], repo: str = "r") -> tuple[list[dict], list[dict]]:
    rollouts, rewards = [], []
    for iid, passes in policy_passes.items():
        for j, ok in enumerate(passes):
            rid = f"{iid}__r{j}"
            rollouts.append(
                {"rollout_id": rid, "instance_id": iid, "repo": repo, "finish_reason": "submitted"}
            )
            rewards.append({"rollout_id": rid, "verify_status": "resolved" if ok else "unresolved"})
    return rollouts, rewards


def test_score_run_counts_graded_rollouts_and_leaves_infra_errors_out():
    rollouts, rewards = _rows({"t1": [True, False, True, False], "t2": [False] * 4, "t3": [True] * 4})
    rollouts.append(
        {"rollout_id": "t2__r4", "instance_id": "t2", "repo": "r", "rollout_status": "infra_error"}
    )
    rollouts.append({"rollout_id": "t2__r5", "instance_id": "t2", "repo": "r", "rollout_status": "timeout"})
    rewards.append({"rollout_id": "t2__r5", "verify_status": "unresolved"})  # graded: counts as a failure
    r = score_run(rollouts, rewards, "p", EvalMode.SAMPLED, 4)
    assert (r["rollouts"], r["graded"], r["resolved"]) == (14, 13, 6)
    assert r["pass_at_1"] == pytest.approx(6 / 13) and r["pass_at_1_ci"] == list(wilson_interval(6, 13))
    # pass@2: (1 - C(2,2)/C(4,2)) for t1, 0 for t2, 1 for t3
    assert r["pass_at_k"]["2"]["value"] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert r["excluded"] == {"rollout_infra_error": 1}
    assert r["resolved_tasks"] == ["t1", "t3"] and r["per_repo"]["r"]["tasks_resolved"] == 2
    assert r["per_task"]["t2"] == {"repo": "r", "n": 6, "graded": 5, "resolved": 0}
    assert pass_k_values(4) == [1, 2, 4] and pass_k_values(6) == [1, 2, 4, 6] and pass_k_values(1) == [1]


def test_compare_pairs_common_tasks():
    a = score_run(
        *_rows({"t1": [False, False], "t2": [True, True], "t3": [False, False]}), "a", EvalMode.SAMPLED, 2
    )
    b = score_run(
        *_rows({"t1": [True, False], "t2": [True, True], "t4": [True, True]}), "b", EvalMode.SAMPLED, 2
    )
    c = compare(a, b, iterations=2000, seed=0)
    assert (c["tasks"], c["tasks_only_a"], c["tasks_only_b"]) == (2, 1, 1)
    assert c["diff"] == pytest.approx(0.25) and c["b_only_resolved"] == ["t1"] and not c["significant"]


def test_compare_without_common_tasks_says_so():
    a = score_run(*_rows({"t1": [True]}), "a", EvalMode.GREEDY, 1)
    b = score_run(*_rows({"t2": [True]}), "b", EvalMode.GREEDY, 1)
    with pytest.raises(ValueError, match="a and b \\(greedy\\) have no scored task in common"):
        compare(a, b)
