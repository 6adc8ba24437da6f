"""Advantage estimators: parity table, verl formulas, edge cases, rollout-vs-sample invariance."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.train.advantages import group_advantages, rollout_level, sample_level
from harnessrl.train.modes import Estimator, SingletonHandling

EPS = 1e-6
S3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 0] is 0.5; of [1, 1, 0] it is sqrt(1/3)

# (estimator, rewards) → expected advantages, computed by hand
PARITY = [
    (
        "grpo",
        [1.0, 0.0, 0.0, 0.0],
        [0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS)],
    ),
    ("grpo", [1.0, 1.0, 0.0], [(1 / 3) / (S3 + EPS), (1 / 3) / (S3 + EPS), (-2 / 3) / (S3 + EPS)]),
    ("grpo", [2.0, 0.0], [1.0 / (math.sqrt(2) + EPS), -1.0 / (math.sqrt(2) + EPS)]),
    ("drgrpo", [1.0, 0.0, 0.0, 0.0], [0.75, -0.25, -0.25, -0.25]),
    ("drgrpo", [0.5, 1.0, 0.0], [0.0, 0.5, -0.5]),
    ("rloo", [1.0, 0.0, 0.0, 0.0], [1.0, -1 / 3, -1 / 3, -1 / 3]),  # r - mean(others)
    ("rloo", [0.5, 1.0, 0.0], [0.0, 0.75, -0.75]),
    ("grpo", [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]),  # zero variance
    ("drgrpo", [1.0, 1.0], [0.0, 0.0]),
    ("rloo", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    ("grpo", [0.7], [0.0]),  # singleton (default policy "zero")
    ("rloo", [0.7], [0.0]),
]


@pytest.mark.parametrize(("estimator", "rewards", "expected"), PARITY)
def test_parity_table(estimator, rewards, expected):
    assert group_advantages(rewards, estimator) == pytest.approx(expected, abs=1e-9)


def verl_grpo(scores: torch.Tensor, norm_by_std: bool, eps: float = 1e-6) -> torch.Tensor:
    """verl compute_grpo_outcome_advantage for one multi-member group (mean, torch.std unbiased)."""
    mean, std = scores.mean(), scores.std()
    return (scores - mean) / (std + eps) if norm_by_std else scores - mean


def verl_rloo(scores: torch.Tensor) -> torch.Tensor:
    n = scores.numel()
    return scores * n / (n - 1) - scores.mean() * n / (n - 1)


@pytest.mark.parametrize("seed", range(5))
def test_matches_verl_formulas(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(6, generator=g, dtype=torch.float64)
    r = scores.tolist()
    assert group_advantages(r, Estimator.GRPO) == pytest.approx(verl_grpo(scores, True).tolist(), rel=1e-9)
    assert group_advantages(r, Estimator.DRGRPO) == pytest.approx(verl_grpo(scores, False).tolist(), rel=1e-9)
    assert group_advantages(r, Estimator.RLOO) == pytest.approx(verl_rloo(scores).tolist(), rel=1e-9)


def test_singleton_raw_matches_verl_lone_response():
    # verl gives a lone response mean 0 / std 1, i.e. its raw reward (up to 1+eps); we make that opt-in
    assert group_advantages([0.7], Estimator.GRPO, singleton=SingletonHandling.RAW) == [0.7]
    assert group_advantages([0.7], Estimator.RLOO, singleton=SingletonHandling.RAW) == [0.7]


def test_groups_are_independent_and_stats_counted():
    advs, st = rollout_level(
        {"a": ("t1", 1.0), "b": ("t1", 0.0), "c": ("t2", 1.0), "d": ("t3", 0.0), "e": ("t3", 0.0)},
        Estimator.DRGRPO,
    )
    assert advs == {"a": 0.5, "b": -0.5, "c": 0.0, "d": 0.0, "e": 0.0}
    assert (st.singleton_groups, st.zero_variance_groups) == (1, 1)


def test_splitting_a_rollout_into_samples_keeps_rollout_level_advantages():
    rewards = {"r0": ("t", 1.0), "r1": ("t", 0.0), "r2": ("t", 0.0)}
    advs, _ = rollout_level(rewards, Estimator.GRPO)
    # r0 produced 3 samples (retokenization / compaction): rollout level does not care...
    per_sample = [(f"r0-s{i}", "t", 1.0) for i in range(3)] + [("r1-s0", "t", 0.0), ("r2-s0", "t", 0.0)]
    # ...but the sample-level ablation's baseline moves: r0's extra samples pull the mean up
    sample_advs, _ = sample_level(per_sample, Estimator.GRPO)
    assert advs["r0"] == pytest.approx(group_advantages([1.0, 0.0, 0.0], Estimator.GRPO)[0])
    assert sample_advs["r1-s0"] != pytest.approx(advs["r1"])
    assert sample_advs["r1-s0"] == pytest.approx(group_advantages([1, 1, 1, 0, 0], Estimator.GRPO)[3])


def test_bad_units_are_named():
    with pytest.raises(ValueError, match="duplicate advantage unit 'a'"):
        sample_level([("a", "t", 1.0), ("a", "t", 0.0)])
    with pytest.raises(ValueError, match="unit 'b'.*no finite reward"):
        sample_level([("b", "t", float("nan"))])
    with pytest.raises(ValueError, match="advantage estimator must be one of grpo, drgrpo, rloo, got 'ppo'"):
        group_advantages([1.0, 0.0], "ppo")  # type: ignore[arg-type]
