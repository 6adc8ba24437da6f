"""Outcome advantages computed per rollout (or per sample, for ablations) within a group.

A group is every rollout of one task. Each rollout has one scalar reward; its advantage is broadcast to
every sample and token of that rollout, so a harness splitting one rollout into several samples
(retokenization, compaction, sub-agents) never changes the group baseline.

Edge cases (explicit, unlike verl's implicit ones):
- singleton group: no baseline exists → advantage 0 (``singleton="zero"``, default) or the raw reward
  (``singleton="raw"``, which is what verl's GRPO/RLOO return for a lone response).
- zero-variance group (all rewards equal): every estimator gives exactly 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harnessrl.choices import parse_choice
from harnessrl.train.modes import Estimator, SingletonHandling


@dataclass(frozen=True)
class Scored:
    """One unit that receives an advantage: a rollout (rollout level) or a sample (sample level)."""

    key: str
    group_id: str
    reward: float


@dataclass
class AdvantageStats:
    singleton_groups: int = 0
    zero_variance_groups: int = 0


def group_advantages(
    rewards: list[float],
    estimator: Estimator,
    eps: float = 1e-6,
    singleton: SingletonHandling = SingletonHandling.ZERO,
) -> list[float]:
    """Advantages for the rewards of one group, in the same order."""
    estimator = parse_choice(Estimator, estimator, "advantage estimator")
    n = len(rewards)
    if n == 0:
        return []
    if n == 1:
        return [0.0] if singleton == SingletonHandling.ZERO else [float(rewards[0])]
    mean = sum(rewards) / n
    if all(r == rewards[0] for r in rewards):
        return [0.0] * n
    if estimator == Estimator.GRPO:
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))  # unbiased, as torch.std
        return [(r - mean) / (std + eps) for r in rewards]
    if estimator == Estimator.DRGRPO:
        return [r - mean for r in rewards]
    # RLOO, mean of the *other* rewards as baseline: r - (S - r)/(n-1) == n/(n-1) * (r - mean)
    return [n / (n - 1) * (r - mean) for r in rewards]


def compute_advantages(
    units: Iterable[Scored],
    estimator: Estimator = Estimator.GRPO,
    eps: float = 1e-6,
    singleton: SingletonHandling = SingletonHandling.ZERO,
) -> tuple[dict[str, float], AdvantageStats]:
    """Advantage per unit key. Keys must be unique; a unit's group is its task."""
    by_group: dict[str, list[Scored]] = defaultdict(list)
    seen: set[str] = set()
    for u in units:
        if u.key in seen:
            raise ValueError(f"duplicate advantage unit {u.key!r}: each rollout must be scored once")
        seen.add(u.key)
        if u.reward is None or not math.isfinite(u.reward):
            raise ValueError(f"unit {u.key!r} (group {u.group_id!r}) has no finite reward: {u.reward!r}")
        by_group[u.group_id].append(u)
    stats = AdvantageStats()
    out: dict[str, float] = {}
    for members in by_group.values():
        rewards = [m.reward for m in members]
        if len(members) == 1:
            stats.singleton_groups += 1
        elif all(r == rewards[0] for r in rewards):
            stats.zero_variance_groups += 1
        for m, a in zip(members, group_advantages(rewards, estimator, eps, singleton), strict=True):
            out[m.key] = a
    return out, stats


def rollout_level(
    rollout_rewards: Mapping[str, tuple[str, float]],
    estimator: Estimator = Estimator.GRPO,
    eps: float = 1e-6,
    singleton: SingletonHandling = SingletonHandling.ZERO,
) -> tuple[dict[str, float], AdvantageStats]:
    """{rollout_id: (group_id, reward)} → {rollout_id: advantage}."""
    return compute_advantages(
        (Scored(k, g, r) for k, (g, r) in rollout_rewards.items()), estimator, eps, singleton
    )


def sample_level(
    samples: Iterable[tuple[str, str, float]],
    estimator: Estimator = Estimator.GRPO,
    eps: float = 1e-6,
    singleton: SingletonHandling = SingletonHandling.ZERO,
) -> tuple[dict[str, float], AdvantageStats]:
    """Ablation: every sample (sample_id, group_id, reward of its rollout) is its own unit in the group."""
    return compute_advantages((Scored(s, g, r) for s, g, r in samples), estimator, eps, singleton)
