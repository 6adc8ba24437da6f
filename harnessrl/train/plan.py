"""The step plan, shared by the train stage and the RL loop: rollout-level (or sample-level) advantages over
the prepared rollouts of a round, groups without signal dropped (data.has_signal), the optimizer steps at group
granularity (all samples of a rollout, indeed of a group, share one step), and each step's sequence items
with their loss weights (losses.sequence_weights: global denominators per step)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from harnessrl.train import advantages as adv_mod
from harnessrl.train.batching import SeqItem
from harnessrl.train.config import UpdateConfig
from harnessrl.train.data import Prepared, Rollout, has_signal
from harnessrl.train.losses import sequence_weights
from harnessrl.train.modes import AdvantageLevel


@dataclass
class Plan:
    rollouts: list[Rollout]
    advantages: dict[str, float]  # rollout_id (or sample_id at sample level) → advantage
    steps: list[list[str]]  # group ids per optimizer step
    counts: dict[str, float]


def plan_round(
    prepared: Prepared,
    cfg: UpdateConfig,
    *,
    groups_per_step: int = 0,
    epochs: int = 1,
    skip: frozenset[str] = frozenset(),
) -> Plan:
    """Advantages over the prepared rollouts and their optimizer steps: `groups_per_step` groups each (0: all
    in one step), every trained group once per epoch in a seeded shuffle. `skip`: groups dynamic sampling
    leaves out (the train stage's pass-rate history)."""
    counts: dict[str, float] = {f"excluded_{k}": v for k, v in prepared.excluded.items()}
    counts.update({f"masked_{k}": v for k, v in prepared.masked.items()})
    rollouts = prepared.rollouts
    groups = sorted({r.group_id for r in rollouts})
    counts["groups_in"] = len(groups)
    counts["rollouts_in"] = len(rollouts)
    skip = skip & set(groups)
    counts["groups_skipped_history"] = len(skip)
    rollouts = [r for r in rollouts if r.group_id not in skip]
    if cfg.advantage_level == AdvantageLevel.ROLLOUT:
        advs, st = adv_mod.rollout_level(
            {r.rollout_id: (r.group_id, r.reward) for r in rollouts},
            cfg.estimator,
            cfg.adv_eps,
            cfg.singleton,
        )
    else:
        advs, st = adv_mod.sample_level(
            ((s.sample_id, r.group_id, r.reward) for r in rollouts for s in r.samples),
            cfg.estimator,
            cfg.adv_eps,
            cfg.singleton,
        )
    counts["groups_zero_variance"] = st.zero_variance_groups
    counts["groups_singleton"] = st.singleton_groups
    zero_var: set[str] = set()
    if cfg.drop_zero_variance:
        by_group: dict[str, list[Rollout]] = defaultdict(list)
        for r in rollouts:
            by_group[r.group_id].append(r)
        zero_var = {g for g, members in by_group.items() if not has_signal(members)}
    rollouts = [r for r in rollouts if r.group_id not in zero_var]
    counts["groups_skipped_zero_variance"] = len(zero_var)
    trained_groups = sorted({r.group_id for r in rollouts if r.trainable})
    counts["groups_trained"] = len(trained_groups)
    counts["rollouts_trained"] = sum(r.trainable for r in rollouts)
    counts["samples_trained"] = sum(len(r.samples) for r in rollouts if r.trainable)
    steps: list[list[str]] = []
    per = groups_per_step or max(len(trained_groups), 1)
    for epoch in range(epochs):
        order = list(trained_groups)
        random.Random(cfg.train.seed * 1000003 + epoch).shuffle(order)
        steps += [order[i : i + per] for i in range(0, len(order), per)]
    return Plan(rollouts=rollouts, advantages=advs, steps=steps, counts=counts)


def step_items(plan: Plan, group_ids: list[str], cfg: UpdateConfig) -> tuple[list[SeqItem], list[Rollout]]:
    gset = set(group_ids)
    members = [r for r in plan.rollouts if r.group_id in gset and r.trainable]
    seqs = [(r, s) for r in members for s in r.samples]
    counts = [sum(s.loss_mask[1:]) for _, s in seqs]
    weights = sequence_weights(
        counts, [r.rollout_id for r, _ in seqs], cfg.train.loss_mode, cfg.train.loss_scale_factor
    )
    items = []
    for (r, s), w in zip(seqs, weights, strict=True):
        a = plan.advantages[r.rollout_id if cfg.advantage_level == AdvantageLevel.ROLLOUT else s.sample_id]
        items.append(
            SeqItem(list(s.input_ids), list(s.loss_mask), list(s.behavior_logprobs), a, w, r.rollout_id)
        )
    return items, members
