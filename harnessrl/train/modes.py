"""Every mode name of the train stage, defined once: configs, functions and the CLI's choices use these."""

from __future__ import annotations

from enum import StrEnum


class Estimator(StrEnum):
    """Outcome-advantage estimator within a group (see advantages.py)."""

    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"


class AdvantageLevel(StrEnum):
    """The unit that receives an advantage: a whole rollout, or each sample (ablation)."""

    ROLLOUT = "rollout"
    SAMPLE = "sample"


class SingletonHandling(StrEnum):
    """Advantage of a lone rollout in its group: 0 (no baseline), or its raw reward (verl's behaviour)."""

    ZERO = "zero"
    RAW = "raw"


class NonOkHandling(StrEnum):
    """What happens to a rollout whose status is not ok (see data.py)."""

    DROP = "drop"
    MASK = "mask"


class LossMode(StrEnum):
    """Loss aggregation: each is a per-sequence weight with global denominators (see losses.py)."""

    TOKEN_MEAN = "token-mean"
    TOKEN_SUM = "token-sum"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
    ROLLOUT_TOKEN_MEAN = "rollout-token-mean"


class Objective(StrEnum):
    """What the per-token loss is: the PPO clipped surrogate (RL) or the negative log-likelihood of the
    trained tokens (supervised fine-tuning on demonstrations; advantages and behavior logprobs unused)."""

    PPO = "ppo"
    SFT = "sft"


class SftSource(StrEnum):
    """Where the sft stage's trajectories come from (see sft.py)."""

    DEMONSTRATIONS = "demonstrations"  # scripted from each task's gold fix through the real harness
    REJECTION = "rejection"  # verified-resolved rollouts of an earlier generate/evaluate run
    BOTH = "both"


class Precision(StrEnum):
    """The trainer's compute format (the engine's `dtype` names are accepted too: float32, bfloat16)."""

    FP32 = "fp32"
    BF16 = "bf16"  # autocast; master weights and optimizer state stay fp32
    AUTO = "auto"  # bf16 where this host multiplies it faster at the model's shapes (harnessrl.numformat)

    @classmethod
    def _missing_(cls, value: object) -> Precision | None:
        return {"float32": cls.FP32, "bfloat16": cls.BF16}.get(str(value))
