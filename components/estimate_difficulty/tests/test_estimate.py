from __future__ import annotations

from components.estimate_difficulty.stage import count_passes


def test_count_passes_excludes_non_ok_rollouts_and_ungraded_verifications():
    rollouts = [
        {"rollout_id": f"a{i}", "instance_id": "a", "repo": "r", "rollout_status": s}
        for i, s in enumerate(["ok", "ok", "timeout", "infra_error", "ok", "ok"])
    ] + [{"rollout_id": "b0", "instance_id": "b", "repo": "r", "rollout_status": "failed"}]
    rewards = [
        {"rollout_id": "a0", "reward": 1.0, "status": "ok", "resolved": True},
        {"rollout_id": "a1", "reward": 0.0, "status": "ok", "resolved": False},
        {
            "rollout_id": "a2",
            "reward": 0.0,
            "status": "ok",
            "resolved": False,
        },  # graded, but the rollout timed out
        {"rollout_id": "a3", "reward": None, "status": "infra_error", "verify_status": "infra_error"},
        {"rollout_id": "a4", "reward": None, "status": "infra_error", "verify_status": "infra_error"},
        # a5: never verified
        {"rollout_id": "b0", "reward": 0.0, "status": "ok", "resolved": False},
    ]
    a, b = count_passes(rollouts, rewards)
    assert (a["n"], a["n_valid"], a["passes"], a["pass_rate"]) == (6, 2, 1, 0.5)
    assert a["excluded"] == {
        "rollout_timeout": 1,
        "rollout_infra_error": 1,
        "verify_infra_error": 1,
        "not_verified": 1,
    }
    assert (b["n"], b["n_valid"], b["passes"], b["pass_rate"]) == (1, 0, 0, None)


def test_a_patch_over_the_cap_is_an_attempt_that_failed():
    rollouts = [
        {"rollout_id": "a0", "instance_id": "a", "repo": "r", "rollout_status": "patch_too_large"},
        {"rollout_id": "a1", "instance_id": "a", "repo": "r", "rollout_status": "ok"},
    ]
    rewards = [
        {"rollout_id": "a0", "reward": 0.0, "status": "ok", "resolved": False},
        {"rollout_id": "a1", "reward": 1.0, "status": "ok", "resolved": True},
    ]
    (a,) = count_passes(rollouts, rewards)
    assert (a["n"], a["n_valid"], a["passes"], a["excluded"]) == (2, 2, 1, {})
