"""Dynamic sampling before generation: spend no rollouts on tasks the pass-rate history says are solved
(pass rate >= high) or hopeless (<= low); tasks with no history yet are always worth sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def worth_sampling(
    pass_rates: Mapping[str, float | None], task_ids: Sequence[str], low: float, high: float
) -> list[str]:
    """The task ids (in their given order) whose recent pass rate is unknown (absent or None) or strictly
    inside (low, high). With low=0, high=1 this skips exactly the all-fail and all-pass tasks."""
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    kept = []
    for task_id in task_ids:
        rate = pass_rates.get(task_id)
        if rate is not None and not 0.0 <= rate <= 1.0:
            raise ValueError(f"task {task_id!r}: pass rate {rate} is not in [0, 1]")
        if rate is None or low < rate < high:
            kept.append(task_id)
    return kept
