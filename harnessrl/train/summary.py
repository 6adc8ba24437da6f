"""The stage's summary metrics (metrics.json) and the strict-JSON rule for every metrics row."""

from __future__ import annotations

import logging
import math
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.train.plan import Plan

logger = logging.getLogger(__name__)


def stats(xs: list[float]) -> dict[str, float | None]:
    """Mean/std/min/max; None for an empty list (metrics must be strict JSON: no NaN)."""
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
    }


def summarize(plan: Plan, history: list[dict]) -> dict:
    rewards = [r.reward for r in plan.rollouts]
    advs = list(plan.advantages.values())
    s: dict = {"steps": len(history), **plan.counts}
    reward_stats = stats(rewards)
    s["reward_mean"], s["reward_std"] = reward_stats["mean"], reward_stats["std"]
    for k, v in stats(advs).items():
        s[f"advantage_{k}"] = v
    s["advantage_zero_fraction"] = sum(1 for a in advs if a == 0) / len(advs) if advs else None
    if history:
        s["loss"] = history[-1]["loss"]
        s["loss_first"] = history[0]["loss"]
        for key in (
            "entropy",
            "clip_frac",
            "dual_clip_frac",
            "grad_norm",
            "tokens_per_s",
            "padding_fraction",
            "is_weight_mean",
            "approx_kl",
        ):
            values = [h[key] for h in history if h.get(key) is not None]
            s[key] = statistics.fmean(values) if values else None
        s["trained_tokens"] = sum(h["trained_tokens"] for h in history)
    elif not plan.counts["rollouts_in"]:
        excluded = ", ".join(
            f"{k[9:]}: {v}" for k, v in sorted(plan.counts.items()) if k.startswith("excluded_")
        )
        s["note"] = (
            f"no rollout has a usable reward (excluded {excluded or 'none: the samples hold no rollout'}), "
            "so reward and advantage statistics are null and the output model is the input policy unchanged"
        )
    else:
        s["note"] = "no trainable groups after filtering: the output model is the input policy unchanged"
    return strict_json(s)


def strict_json(row: dict) -> dict:
    """`row` with every non-finite float replaced by None (named under "nonfinite"): metrics files are strict
    JSON, which has no NaN or Infinity."""
    bad = sorted(k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v))
    if not bad:
        return row
    logger.warning("non-finite metric(s) %s written as null", ", ".join(bad))
    return {**{k: None if k in bad else v for k, v in row.items()}, "nonfinite": bad}
