"""The update settings: how finished rollouts become an optimizer step (advantages, loss aggregation, the
optimizer, which rollout statuses are scored) and how a run keeps checkpoints and pass-rate history.

One definition, shared: the train stage's `TrainConfig` (harnessrl.train.round) and the RL loop's `RLConfig`
(harnessrl.rl.config) both extend `UpdateConfig`, so the same JSON keys mean the same thing in both
(`{"estimator": "rloo", "train": {"optim": {"lr": 1e-5}}}`), and the code that plans and takes a step
(`round.plan_round`, `round.step_items`, the RL loop's Learner) reads only these fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.schema import RolloutStatus, Sample, scored_statuses
from harnessrl.train.data import Prepared, RewardRow, assemble
from harnessrl.train.modes import AdvantageLevel, Estimator, NonOkHandling, SingletonHandling
from harnessrl.train.trainer import TrainerConfig


@dataclass
class UpdateConfig:
    train: TrainerConfig = field(default_factory=TrainerConfig)  # the optimizer step: losses, optimizer
    estimator: Estimator = Estimator.GRPO
    advantage_level: AdvantageLevel = AdvantageLevel.ROLLOUT  # SAMPLE is an ablation
    adv_eps: float = 1e-6
    singleton: SingletonHandling = SingletonHandling.ZERO
    nonok: NonOkHandling = NonOkHandling.DROP  # see data.py
    mask_reward: float = 0.0
    # scored besides ok and patch_too_large (schema.scored_statuses; never infra_error); the others follow `nonok`
    ok_statuses: tuple[RolloutStatus, ...] = (RolloutStatus.OK,)
    drop_zero_variance: bool = True
    device: str = "auto"
    # CPU threads for torch (0: every core). Set by the run itself, never inherited from whatever ran before
    # in the process: the thread count decides the order of float reductions, so a resumed run repeats the
    # interrupted one bit for bit only at the same count.
    threads: int = 0
    reference_kl: bool = False  # a frozen copy of the input policy as KL reference (needs policy.kl_coef > 0)
    history_last_k: int = 3  # pass-rate history: a task's last K groups decide dynamic sampling
    pass_threshold: float = 1.0  # reward ≥ this counts as a pass in the history
    save_every: int = 0  # checkpoint every N optimizer steps (0: only the final model)
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:  # choices may arrive as strings (JSON configs, KFP parameters)
        self.estimator = parse_choice(Estimator, self.estimator, "estimator")
        self.advantage_level = parse_choice(AdvantageLevel, self.advantage_level, "advantage_level")
        self.singleton = parse_choice(SingletonHandling, self.singleton, "singleton")
        self.nonok = parse_choice(NonOkHandling, self.nonok, "nonok")
        self.ok_statuses = tuple(parse_choice(RolloutStatus, s, "ok_statuses") for s in self.ok_statuses)
        scored_statuses(self.ok_statuses)  # refuses an infrastructure status
        if self.threads < 0 or self.save_every < 0 or self.keep_checkpoints < 1 or self.history_last_k < 1:
            raise ValueError("need threads ≥ 0, save_every ≥ 0, keep_checkpoints ≥ 1 and history_last_k ≥ 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def prepare(self, samples: list[Sample], rewards: dict[str, RewardRow] | None) -> Prepared:
        """The rollouts of `samples`, placed under these settings (data.assemble: scored, masked or left out)."""
        return assemble(
            samples, rewards, nonok=self.nonok, mask_reward=self.mask_reward, ok_statuses=self.ok_statuses
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any], what: str = "config") -> Any:
        """`d` laid over the defaults; an unknown key is refused, naming the known ones."""
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"{what}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        train = TrainerConfig.from_dict(d.pop("train", {}))
        if "ok_statuses" in d:
            d["ok_statuses"] = tuple(d["ok_statuses"])
        return cls(train=train, **d)
