"""Bounded staleness for async RL: which groups may start generating, and which finished groups may train.

Version arithmetic: the trainer's version `v` is the number of optimizer steps taken so far; a group's
staleness when trained is `trainer_version - oldest_token_version`, the oldest policy version that sampled
one of its tokens (a partial rollout resumed across a weight sync carries several versions).

Admission (before generation): with `batch_groups` groups per optimizer step, a new group may start only
while `accepted + running < (max_staleness + version + 1) * batch_groups`, where `accepted` counts every
finished group handed to the trainer so far (cumulative, trained or waiting) and `running` the groups
generating now. This caps how far generation can run ahead of the trainer: groups started at version `v`
fill at most the batches `v .. v + max_staleness`. Nor does a group start that no step of the run could train:
the window ends at the run's last batch (`steps`), so the last step's rollouts are not joined by a next step's
that would only be thrown away (a demo of 6 steps with one step of staleness had started 35 groups for the 27 it
finished: 64 rollouts wasted on 2 cores).

Admission alone does not bound a long-tail group's staleness: a group can keep generating while the others
finish and the trainer steps on. So every finished group passes `is_stale` before training and the
`StalePolicy` decides: DROP (regenerate the task; exact bound) or KEEP (train it anyway, with the truncated
importance weights correcting the off-policy tokens).
"""

from __future__ import annotations

from enum import StrEnum


class StalePolicy(StrEnum):
    """What happens to a finished group whose oldest token is more than `max_staleness` versions old."""

    DROP = "drop"  # discard it; the task is generated again by the current policy
    KEEP = "keep"  # train it anyway (TIS corrects the off-policy tokens)


def _check_non_negative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _window(version: int, max_staleness: int, batch_groups: int, steps: int | None) -> int:
    """Groups the window holds: `min(max_staleness + version + 1, steps) * batch_groups`."""
    if batch_groups < 1:
        raise ValueError(f"batch_groups must be >= 1, got {batch_groups}")
    batches = max_staleness + version + 1
    return (batches if steps is None else min(batches, steps)) * batch_groups


def can_admit(
    accepted: int, running: int, version: int, max_staleness: int, batch_groups: int, steps: int | None = None
) -> bool:
    """True iff one more group may start generating: `accepted + running < min(max_staleness + version + 1,
    steps) * batch_groups` (`steps`: the run's optimizer steps; None: unbounded). `max_staleness=0` with
    nothing in flight admits exactly one batch per version (sync)."""
    return admission_capacity(accepted, running, version, max_staleness, batch_groups, steps) > 0


def admission_capacity(
    accepted: int, running: int, version: int, max_staleness: int, batch_groups: int, steps: int | None = None
) -> int:
    """How many more groups `can_admit` would let start now (0 when none)."""
    _check_non_negative(accepted=accepted, running=running, version=version, max_staleness=max_staleness)
    return max(0, _window(version, max_staleness, batch_groups, steps) - accepted - running)


def staleness(oldest_token_version: int, trainer_version: int) -> int:
    """Policy versions between the oldest token of a group and the trainer about to train on it."""
    _check_non_negative(oldest_token_version=oldest_token_version, trainer_version=trainer_version)
    if oldest_token_version > trainer_version:
        raise ValueError(
            f"a token sampled by policy version {oldest_token_version} cannot be newer than the trainer "
            f"(version {trainer_version}); the engine's version counter is ahead of the trainer's"
        )
    return trainer_version - oldest_token_version


def is_stale(oldest_token_version: int, trainer_version: int, max_staleness: int) -> bool:
    """True iff the group's oldest token is more than `max_staleness` versions behind the trainer."""
    _check_non_negative(max_staleness=max_staleness)
    return staleness(oldest_token_version, trainer_version) > max_staleness


def keep_group(
    policy: StalePolicy, oldest_token_version: int, trainer_version: int, max_staleness: int
) -> bool:
    """The per-group drop-or-keep decision: fresh groups are always trained; stale ones per `policy`."""
    if not is_stale(oldest_token_version, trainer_version, max_staleness):
        return True
    return policy is StalePolicy.KEEP
