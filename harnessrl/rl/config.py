"""The RL loop's settings (`harnessrl stage rl --config`, the `rl_loop` component's `config_json`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.rl.modes import RLMode, WeightSyncMode
from harnessrl.train.round import TrainConfig


@dataclass
class RLConfig:
    mode: RLMode = RLMode.COLOCATED
    steps: int = 10  # optimizer steps
    batch_groups: int = 4  # groups per optimizer step
    group_size: int = 4  # rollouts per group
    concurrency: int = 0  # rollouts in flight (0: 2 × batch_groups × group_size; sync: batch × group)
    max_staleness: int = 1  # async modes: admission bound (versions a group may lag behind the trainer)
    stale_policy: str = "keep"  # harnessrl.rl.admission.StalePolicy: drop or keep a too-stale group
    max_groups_per_step: int = 0  # groups tried per step before training on what has signal (0: 4 × batch)
    dynamic_low: float = 0.0  # dynamic sampling: skip tasks whose recent pass rate is <= low or >= high
    dynamic_high: float = 1.0
    history_last_k: int = 3
    pass_threshold: float = 1.0  # reward ≥ this counts as a pass in the history
    save_every: int = 0  # checkpoint every K steps (0: only the final model)
    keep_checkpoints: int = 2
    seed: int = 0
    replicas: int = 1  # local engines behind a Router (several --engine-url values do the same remotely)
    nproc: int = 1  # trainer ranks (torchrun; FSDP2 over the ranks' GPUs, or gloo on CPU): harnessrl.rl.ranks
    engine_threads: int | None = None  # LocalEngine torch threads (None: adaptive)
    max_batch: int = 32  # LocalEngine batch slots
    lend_slots: int = 0  # separate mode: extra rollouts the trainer's share runs while lent (0: one batch)
    switch_prior_s: float = 1.0  # separate mode: assumed cost of one role switch before one is measured
    switch_min_gain: float = 1.0
    prompt_max_tokens: int = 64  # prompt workload: max tokens per reply
    temperature: float = 1.0  # prompt workload
    verify_timeout_s: float = 120.0  # swe workload: test run per rollout
    allow_unsandboxed: bool = False
    tool_format: str = (
        ""  # the gateway's tool-call parser (hermes | qwen | ...); "": read off the chat template
    )
    weight_sync: WeightSyncMode = WeightSyncMode.CHECKPOINT  # how weights reach the engines (rl/publish.py)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        from harnessrl.rl.admission import StalePolicy

        self.mode = parse_choice(RLMode, self.mode, "mode")
        self.weight_sync = parse_choice(WeightSyncMode, self.weight_sync, "weight_sync")
        parse_choice(StalePolicy, self.stale_policy, "stale_policy")
        if self.tool_format:
            from harnessrl.gateway.toolcalls import ToolParser

            parse_choice(ToolParser, self.tool_format, "tool_format")
        for name in ("steps", "batch_groups", "group_size", "replicas", "nproc", "max_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("concurrency", "max_staleness", "max_groups_per_step", "save_every", "lend_slots"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.dynamic_low < self.dynamic_high <= 1.0:
            raise ValueError(
                f"need 0 <= dynamic_low < dynamic_high <= 1, got {self.dynamic_low}, {self.dynamic_high}"
            )

    @property
    def rollout_slots(self) -> int:
        if self.concurrency:
            return self.concurrency
        full = self.batch_groups * self.group_size
        return full if self.mode is RLMode.SYNC else 2 * full

    @property
    def lent_rollouts(self) -> int:
        """Separate mode: rollouts the trainer's share runs while lent."""
        return self.lend_slots or self.batch_groups * self.group_size

    @property
    def group_budget(self) -> int:
        return self.max_groups_per_step or 4 * self.batch_groups

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RLConfig:
        d = dict(d)
        train = TrainConfig.from_dict(d.pop("train", {}))
        try:
            return cls(train=train, **d)
        except TypeError as e:  # an unknown key
            known = sorted(f for f in cls.__dataclass_fields__ if f != "train")
            raise ValueError(f"rl config: {e}; known fields: {', '.join(known)}, train") from None
