"""Loads the train stage's inputs and joins them into rollouts: samples (Parquet) + rewards (verify JSONL); and
the one rule for what a group's rollouts are worth to a step (`assemble`, `has_signal`), which the train
stage and the RL loop (its learner, and its driver deciding which groups to replace) both apply.

A rollout whose status is scored (`schema.scored_statuses`: ok and patch_too_large, plus the settings'
`ok_statuses`) trains on its reward; one without a reward is left out (`missing_reward`). The others are never
trained as reward 0 silently:
- ``drop``: the rollout leaves the round entirely — not trained, not in its group's baseline.
- ``mask``: the rollout stays in its group's baseline with an explicit reward (its verify reward if it has
  one, else ``mask_reward``), but none of its tokens are trained. Use it when a failure (e.g. a timeout)
  should count as a failed attempt for the other rollouts' advantages. An infrastructure failure
  (`schema.INFRA_STATUSES`) is never masked: it is always dropped, never anyone's 0.
Both are counted in the stage metrics by status.

A group has signal (`has_signal`) when its rollouts in the round — the scored ones and, under ``mask``, the
masked ones — do not all have the same reward and at least one of them trains: only then does a trained
rollout get an advantage. The step plan drops the groups without it; the RL loop replaces them.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.choices import parse_choice
from harnessrl.io import read_jsonl
from harnessrl.schema import INFRA_STATUSES, RolloutStatus, Sample, scored_statuses
from harnessrl.train.modes import NonOkHandling


@dataclass
class Rollout:
    rollout_id: str
    group_id: str
    reward: float
    status: RolloutStatus
    samples: list[Sample]
    trainable: bool = True  # False: in the baseline only (mask policy)


@dataclass
class RewardRow:
    reward: float | None
    status: RolloutStatus


@dataclass
class Prepared:
    rollouts: list[Rollout]
    excluded: Counter = field(default_factory=Counter)  # reason -> rollouts
    masked: Counter = field(default_factory=Counter)  # status -> rollouts kept in baseline only


def _files(path: Path, suffix: str, preferred: str | None = None) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if preferred and (path / preferred).is_file():
        return [path / preferred]
    found = sorted(p for p in path.rglob(f"*{suffix}") if p.is_file())
    if not found:
        raise FileNotFoundError(f"{path}: contains no *{suffix} file")
    return found


def validate_sample(s: Sample, where: str) -> None:
    n = len(s.input_ids)
    if n < 2:
        raise ValueError(f"{where}: input_ids has {n} token(s); a sample needs a prompt and ≥1 sampled token")
    for name in ("loss_mask", "behavior_logprobs"):
        if len(getattr(s, name)) != n:
            raise ValueError(
                f"{where}: {name} has {len(getattr(s, name))} entries but input_ids has {n}; "
                "they must align token for token"
            )
    if any(m not in (0, 1) for m in s.loss_mask):
        raise ValueError(f"{where}: loss_mask must contain only 0/1")
    if s.loss_mask[0]:
        raise ValueError(
            f"{where}: loss_mask[0] is 1, but the first token has no prefix to be sampled from; "
            "the first token must be context (mask 0)"
        )
    if not s.rollout_id or not s.group_id:
        raise ValueError(f"{where}: rollout_id and group_id must be non-empty")
    if any(
        not math.isfinite(b) or b > 1e-6 for b, m in zip(s.behavior_logprobs, s.loss_mask, strict=True) if m
    ):
        raise ValueError(
            f"{where}: behavior_logprobs of trained tokens must be finite log-probabilities (≤ 0)"
        )


def load_samples(path: str | Path) -> list[Sample]:
    """Reads one Parquet file or every *.parquet under a directory; one row per Sample."""
    import pyarrow.parquet as pq

    samples: list[Sample] = []
    required = {"sample_id", "rollout_id", "group_id", "input_ids", "loss_mask", "behavior_logprobs"}
    for f in _files(Path(path), ".parquet", preferred="samples.parquet"):
        table = pq.read_table(f)
        missing = required - set(table.column_names)
        if missing:
            raise ValueError(
                f"{f}: missing column(s) {sorted(missing)}; a sample row needs {sorted(required)}"
            )
        for i, row in enumerate(table.to_pylist()):
            s = Sample.from_row(row)
            validate_sample(s, f"{f}: row {i} (sample {s.sample_id!r})")
            samples.append(s)
    return samples


def load_rewards(path: str | Path) -> dict[str, RewardRow]:
    """Reads verify's JSONL (rows keyed by rollout_id with reward and status)."""
    out: dict[str, RewardRow] = {}
    for f in _files(Path(path), ".jsonl", preferred="rewards.jsonl"):
        for i, row in enumerate(read_jsonl(f), 1):
            rid = row.get("rollout_id")
            if not rid:
                raise ValueError(f"{f}: row {i}: missing rollout_id")
            if rid in out:
                raise ValueError(
                    f"{f}: row {i}: rollout {rid!r} has a second reward row; verify must grade once"
                )
            reward = row.get("reward")
            if reward is not None and (not isinstance(reward, int | float) or not math.isfinite(reward)):
                raise ValueError(
                    f"{f}: row {i} (rollout {rid!r}): reward must be a finite number or null, got {reward!r}"
                )
            status = parse_choice(
                RolloutStatus, row.get("status", "ok"), f"{f}: row {i} (rollout {rid!r}): status"
            )
            out[rid] = RewardRow(None if reward is None else float(reward), status)
    return out


def assemble(
    samples: list[Sample],
    rewards: dict[str, RewardRow] | None,
    *,
    nonok: NonOkHandling = NonOkHandling.DROP,
    mask_reward: float = 0.0,
    ok_statuses: Iterable[RolloutStatus] = (),
) -> Prepared:
    """Groups samples by rollout and attaches each rollout's reward and status, placed as the module docstring
    says (`ok_statuses`: scored in addition to schema.SCORED_STATUSES)."""
    nonok = parse_choice(NonOkHandling, nonok, "nonok")
    scored = scored_statuses(ok_statuses)
    by_rollout: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_rollout[s.rollout_id].append(s)
    prepared = Prepared(rollouts=[])
    for rid, members in by_rollout.items():
        groups = {s.group_id for s in members}
        if len(groups) > 1:
            raise ValueError(
                f"rollout {rid!r}: its samples name different groups {sorted(groups)}; "
                "a rollout belongs to exactly one task"
            )
        row = rewards.get(rid) if rewards is not None else None
        status = row.status if row is not None else members[0].rollout_status
        reward = row.reward if row is not None else members[0].reward
        if status in scored:
            if reward is None:
                prepared.excluded["missing_reward"] += 1
                continue
            prepared.rollouts.append(Rollout(rid, members[0].group_id, reward, status, members))
        elif nonok == NonOkHandling.DROP or status in INFRA_STATUSES:
            prepared.excluded[f"status:{status}"] += 1
        else:
            prepared.masked[status] += 1
            prepared.rollouts.append(
                Rollout(
                    rid,
                    members[0].group_id,
                    mask_reward if reward is None else reward,
                    status,
                    members,
                    trainable=False,
                )
            )
    if rewards is not None:
        orphans = set(rewards) - set(by_rollout)
        if orphans:
            prepared.excluded["reward_without_samples"] += len(orphans)
    return prepared


def has_signal(members: Iterable[Rollout]) -> bool:
    """Whether a group's prepared rollouts give a trained one an advantage (the module docstring)."""
    members = list(members)
    return any(m.trainable for m in members) and len({m.reward for m in members}) > 1
