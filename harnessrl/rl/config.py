"""The RL loop's settings (`harnessrl stage rl --config`, the `rl_loop` component's `config_json`): the update
settings it shares with the train stage (harnessrl.train.config: estimator, advantages, losses, optimizer,
checkpoint keeping, pass-rate history) and the loop's own (mode, step size, rollouts in flight, staleness,
engines, weight sync, workload)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.choices import parse_choice
from harnessrl.engine.base import DType, WeightSyncMode
from harnessrl.rl.modes import RLMode, RolloutWorkers, TrainerNodes, WorkloadKind
from harnessrl.schema import SpecMix
from harnessrl.train.config import UpdateConfig
from harnessrl.train.distributed import Rendezvous

if TYPE_CHECKING:
    from harnessrl.rollout.specs import NamedSpec

logger = logging.getLogger(__name__)

# settings that change no step's result: a resumed run may extend `steps` or change how often it saves
UNHASHED = (
    "steps", "save_every", "keep_checkpoints", "engine_threads", "weight_sync", "max_restarts", "rollout_workers",
)  # fmt: skip
# settings the identities of earlier versions did not hash, with the value that behaves as they did: hashed only
# when set otherwise (tests/rl/test_records.py keeps those identities)
ADDED_LATER: dict[str, object] = {
    "engine_dtype": "float32", "environments": (), "nnodes": 1, "spec_mix": "sample",
}  # fmt: skip


@dataclass
class RLConfig(UpdateConfig):
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
    seed: int = 0
    replicas: int = 1  # local engines behind a Router (several --engine-url values do the same remotely)
    rollout_workers: RolloutWorkers = RolloutWorkers.THREADS  # where rollouts run (harnessrl.rl.runners)
    nproc: int = (
        1  # trainer ranks per node (torchrun; FSDP2 over the ranks' GPUs, or gloo on CPU): rl/ranks.py
    )
    nnodes: int = 1  # nodes the trainer ranks span (node 0 runs the loop; each node runs `nproc` ranks)
    max_restarts: int = (
        2  # with trainer ranks: a failed rank restarts them all, resumed from the last checkpoint
    )
    engine_threads: int | None = None  # LocalEngine torch threads (None: adaptive)
    # LocalEngine weights' format (auto: what this host multiplies faster, harnessrl.numformat); the trainer's
    # is `train.precision`. Under bf16 the engine's logprobs are what it sampled from; TIS corrects the gap
    engine_dtype: DType = DType.FLOAT32
    max_batch: int = 32  # LocalEngine batch slots
    lend_slots: int = 0  # separate mode: extra rollouts the trainer's share runs while lent (0: one batch)
    switch_prior_s: float = 1.0  # separate mode: assumed cost of one role switch before one is measured
    switch_min_gain: float = 1.0
    prompt_max_tokens: int = 64  # prompt workload: max tokens per reply
    temperature: float = 1.0  # prompt workload
    verify_timeout_s: float = 120.0  # swe workload: test run per rollout
    environments: tuple[str, ...] = ()  # train only on the task set's tasks of these environments (): all
    spec_mix: SpecMix = SpecMix.SAMPLE  # several harness specs: mixed inside each group, or one per group
    allow_unsandboxed: bool = False
    tool_format: str = (
        ""  # the gateway's tool-call parser (hermes | qwen | ...); "": read off the chat template
    )
    weight_sync: WeightSyncMode = WeightSyncMode.CHECKPOINT  # how weights reach the engines (rl/publish.py)

    def __post_init__(self) -> None:
        from harnessrl.rl.admission import StalePolicy

        super().__post_init__()
        self.environments = tuple(self.environments)
        self.mode = parse_choice(RLMode, self.mode, "mode")
        self.weight_sync = parse_choice(WeightSyncMode, self.weight_sync, "weight_sync")
        self.rollout_workers = parse_choice(RolloutWorkers, self.rollout_workers, "rollout_workers")
        self.engine_dtype = parse_choice(DType, self.engine_dtype, "engine_dtype")
        self.spec_mix = parse_choice(SpecMix, self.spec_mix, "spec_mix")
        parse_choice(StalePolicy, self.stale_policy, "stale_policy")
        if self.tool_format:
            from harnessrl.gateway.toolcalls import ToolParser

            parse_choice(ToolParser, self.tool_format, "tool_format")
        for name in ("steps", "batch_groups", "group_size", "replicas", "nproc", "nnodes", "max_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("concurrency", "max_staleness", "max_groups_per_step", "lend_slots", "max_restarts"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.dynamic_low < self.dynamic_high <= 1.0:
            raise ValueError(
                f"need 0 <= dynamic_low < dynamic_high <= 1, got {self.dynamic_low}, {self.dynamic_high}"
            )

    @property
    def trainer_ranks(self) -> int:
        return self.nproc * self.nnodes

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

    @classmethod
    def from_dict(cls, d: dict[str, Any], what: str = "rl config") -> RLConfig:
        return super().from_dict(current_layout(d), what)

    def hashed_settings(self) -> dict[str, Any]:
        """The settings a run's identity hashes (train.fingerprint), less what changes no step's result, in
        the layout the identities of earlier versions were computed on — the update settings nested under
        "train" beside the train stage's own fields at their defaults (they never applied to the loop) — so
        that a checkpoint written before the configs were shared still resumes."""
        from harnessrl.train.round import TrainConfig
        from harnessrl.train.trainer import TrainerConfig

        own = {f.name for f in fields(RLConfig)} - {f.name for f in fields(UpdateConfig)}
        shared = {f.name for f in fields(UpdateConfig)}
        everything = self.to_dict()
        legacy = {k: v for k, v in everything.items() if k in own}
        for name in ("history_last_k", "pass_threshold", "save_every", "keep_checkpoints"):
            legacy[name] = everything[name]  # the loop's own then; the nested copies kept their defaults
        nested = TrainConfig().to_dict()
        nested.update({k: v for k, v in everything.items() if k in shared and k not in legacy})
        nested["train"] = TrainerConfig.hashed(nested["train"])
        legacy["train"] = nested
        for name, before in ADDED_LATER.items():  # at the value that behaves as before: the same identity
            if legacy.get(name) == before:
                del legacy[name]
        return {k: v for k, v in legacy.items() if k not in UNHASHED}


def current_layout(d: dict[str, Any]) -> dict[str, Any]:
    """Earlier versions nested the update settings one level deeper: `"train"` held the train stage's whole
    config (`{"train": {"estimator": ..., "threads": 1, "train": {"optim": ...}}}`). Such a config — one whose
    `"train"` holds a key the optimizer-step settings (TrainerConfig) do not have — is read as
    `{"estimator": ..., "threads": 1, "train": {"optim": ...}}`; the train stage's own fields, which never
    applied to the loop, are dropped with a warning."""
    from harnessrl.train.trainer import TrainerConfig

    inner = d.get("train")
    step_fields = {f.name for f in fields(TrainerConfig)}
    if not (isinstance(inner, dict) and set(inner) - step_fields):
        return dict(d)
    logger.warning(
        "rl config: reading the update settings nested under 'train' (the layout of earlier versions)"
    )
    shared = {f.name for f in fields(UpdateConfig)} - {"train"}
    lifted = {k: v for k, v in d.items() if k != "train"}
    ignored = sorted(set(inner) - shared - {"train"})
    if ignored:
        logger.warning(
            "rl config: train.%s applied only to the train stage; ignored", ", train.".join(ignored)
        )
    lifted.update({k: v for k, v in inner.items() if k in shared and k not in lifted})
    lifted["train"] = dict(inner.get("train") or {})
    return lifted


@dataclass
class RLInputs:
    """What one run reads and where it writes (beside its settings)."""

    workload: WorkloadKind
    tasks: Path  # task-set directory (swe) or prompt JSONL (prompt)
    out: Path
    policy: str | None = None  # HF model dir or s3:// URI; None: the tiny model
    specs: list[NamedSpec] | str | Path | None = None  # swe: harness specs (list, spec file, None: default)
    engine_urls: list[str] = field(default_factory=list)  # remote engines; empty: local engines
    resume: bool = False
    model_out: Path | None = None
    upload_to: str | None = None  # s3:// prefix for checkpoints and the final model
    rendezvous: Rendezvous = field(default_factory=Rendezvous)  # this node's place among the trainer's nodes
    trainer_nodes: TrainerNodes = (
        TrainerNodes.MANUAL
    )  # who starts the other nodes' commands (node 0's choice)

    @property
    def final_model(self) -> Path:
        return self.model_out or self.out / "model"
