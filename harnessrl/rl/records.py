"""What the RL loop records: one `StepRecord` per optimizer step and the run's `RLSummary`.

A step record is written by the loop only (`MetricsSink`: a row of `steps.jsonl`, TensorBoard scalars, the
one-line echo) and read back as a record by everyone else — the summary below, the stage report
(rl/report.py), a resumed run (its checkpoint keeps the rows so far) and the pipeline's run summary
(components/summarize_run). A row is flat JSON: the collection's counts, the update's figures (the trainer's
own under their names: loss, grad_norm, tokens_per_s, ...), what the step's sampled replies looked like
(gateway/replies.py: mean_reply_tokens, length_finish_share, distinct_2) and the step's timings side by side.
Rows written by earlier versions read back too (fields they lack are None).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast

from harnessrl.gateway.replies import ReplyFigures
from harnessrl.rl.modes import StepOutcome
from harnessrl.train.summary import stats, strict_json
from harnessrl.train.trainer import STEP_METRICS, StepMetrics


@dataclass
class Collected:
    """What collecting one step's groups took (drivers.py fills it in)."""

    groups_zero_variance: int = 0
    groups_stale_dropped: int = 0
    rollouts_finished: int = 0  # scored rollouts with a reward that finished (their group trained or not)
    reward_sum: float = 0.0  # their rewards
    tokens_generated: int = 0
    wait_s: float = 0.0  # trainer waiting for data
    pause_s: float = 0.0  # colocated: pause + abort round trip
    lent_s: float = 0.0
    role_switches: int = 0
    groups_discarded: list[str] = field(default_factory=list)  # groups without signal, or too stale
    groups_skipped: list[str] = field(default_factory=list)  # dynamic sampling skipped them before sampling
    dynamic_sampling_exhausted: int = 0  # the pool's count so far: every task would have been skipped
    # Samples per rollout (a CLI agent's side calls, subagents and compaction are chains of their own): of the
    # finished rollouts with at least one sample, how many stayed one sample, and all their samples
    sampled_rollouts: int = 0
    single_sample_rollouts: int = 0
    samples_collected: int = 0

    def add_rewards(self, rewards: list[float]) -> None:
        self.rollouts_finished += len(rewards)
        self.reward_sum += sum(rewards)

    def add_samples(self, rollout_ids: list[str]) -> None:
        """The rollout id of each sample of a finished group (its `Group.samples`)."""
        per_rollout = Counter(rollout_ids)
        self.sampled_rollouts += len(per_rollout)
        self.single_sample_rollouts += sum(n == 1 for n in per_rollout.values())
        self.samples_collected += len(rollout_ids)

    @property
    def single_sample_share(self) -> float | None:
        return self.single_sample_rollouts / self.sampled_rollouts if self.sampled_rollouts else None

    @property
    def samples_per_rollout_mean(self) -> float | None:
        return self.samples_collected / self.sampled_rollouts if self.sampled_rollouts else None

    @property
    def reward_all_mean(self) -> float | None:
        return self.reward_sum / self.rollouts_finished if self.rollouts_finished else None

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        del out["reward_sum"], out["single_sample_rollouts"], out["samples_collected"]  # rows keep the ratios
        out.update(
            reward_all_mean=self.reward_all_mean,
            groups_skipped_dynamic=len(self.groups_skipped),
            single_sample_share=self.single_sample_share,
            samples_per_rollout_mean=self.samples_per_rollout_mean,
        )
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Collected:
        known = {f.name for f in fields(cls)} - {"reward_sum", "single_sample_rollouts", "samples_collected"}
        got = cls(**{k: row[k] for k in known if row.get(k) is not None})
        got.reward_sum = float(row.get("reward_all_mean") or 0.0) * got.rollouts_finished
        n = got.sampled_rollouts
        got.single_sample_rollouts = round(float(row.get("single_sample_share") or 0.0) * n)
        got.samples_collected = round(float(row.get("samples_per_rollout_mean") or 0.0) * n)
        return got


@dataclass
class Update:
    """One optimizer step on a batch of groups (the Learner's result)."""

    trainer: StepMetrics  # the trainer's own figures
    train_s: float
    reward_mean: float | None
    reward_std: float | None
    rollouts_trained: int
    groups_trained: int
    staleness_mean: float
    staleness_max: int
    partial_rollouts: int
    excluded: int

    def row(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trainer"}
        return {**{k: v for k, v in self.trainer.items() if k != "step"}, **own}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Update | None:
        if row.get("outcome") != StepOutcome.TRAINED:
            return None
        trainer = cast(StepMetrics, {k: row[k] for k in STEP_METRICS if k in row})  # read back as written

        def count(name: str) -> int:
            return int(row.get(name) or 0)

        return cls(
            trainer=trainer,
            train_s=float(row.get("train_s") or 0.0),
            reward_mean=row.get("reward_mean"),
            reward_std=row.get("reward_std"),
            rollouts_trained=count("rollouts_trained"),
            groups_trained=count("groups_trained"),
            staleness_mean=float(row.get("staleness_mean") or 0.0),
            staleness_max=count("staleness_max"),
            partial_rollouts=count("partial_rollouts"),
            excluded=count("excluded"),
        )


@dataclass
class StepRecord:
    step: int
    mode: str
    outcome: StepOutcome
    version: int  # the policy version after this step
    groups: list[str]  # the groups trained on (or offered, when none had signal)
    collected: Collected
    update: Update | None
    weight_sync_s: float
    engine_idle_frac: float | None  # None when an engine reports no figures
    gen_tokens_per_s: float
    step_s: float
    wall_s: float  # since the run started, resumed attempts included
    # the replies of every rollout of the groups the step finished (trained or discarded: rollouts/step-N)
    replies: ReplyFigures = field(default_factory=ReplyFigures)
    weight_sync_bytes: int = 0  # what the sync sent: every weight, or a LoRA run's adapter alone

    @property
    def loss(self) -> float | None:
        return None if self.update is None else self.update.trainer.get("loss")

    @property
    def reward_mean(self) -> float | None:
        return None if self.update is None else self.update.reward_mean

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "mode": self.mode, "groups": self.groups}
        out.update(self.update.row() if self.update is not None else {"groups_trained": 0})
        out.update(self.collected.row())
        out.update(self.replies.row())
        out.update(
            outcome=str(self.outcome),
            version=self.version,
            weight_sync_s=self.weight_sync_s,
            weight_sync_bytes=self.weight_sync_bytes,
            engine_idle_frac=self.engine_idle_frac,
            gen_tokens_per_s=self.gen_tokens_per_s,
            step_s=self.step_s,
            wall_s=self.wall_s,
        )
        return strict_json(out)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRecord:
        return cls(
            step=int(row["step"]),
            mode=str(row.get("mode", "")),
            outcome=StepOutcome(row.get("outcome", StepOutcome.NO_SIGNAL)),
            version=int(row.get("version") or 0),
            groups=list(row.get("groups") or []),
            collected=Collected.from_row(row),
            update=Update.from_row(row),
            weight_sync_s=float(row.get("weight_sync_s") or 0.0),
            engine_idle_frac=row.get("engine_idle_frac"),
            gen_tokens_per_s=float(row.get("gen_tokens_per_s") or 0.0),
            step_s=float(row.get("step_s") or 0.0),
            wall_s=float(row.get("wall_s") or 0.0),
            replies=ReplyFigures.from_row(row),
            weight_sync_bytes=int(row.get("weight_sync_bytes") or 0),
        )


@dataclass(frozen=True)
class EngineRates:
    """Measured engine speeds over the run: forward-pass tokens per second of decode rows and of prompt
    tokens (what benchmarks/async_sim.py calibrates from); None when the engines report no figures."""

    decode_tokens_per_s: float | None = None
    prefill_tokens_per_s: float | None = None


@dataclass
class RLSummary:
    """The run at a glance (`metrics.json`, the stage's KFP metrics, the CLI's last line)."""

    mode: str
    steps: int
    steps_trained: int
    version: int
    groups_trained: int
    groups_zero_variance: int
    groups_stale_dropped: int
    groups_skipped_dynamic: int
    groups_started: int
    reward_first: float | None
    reward_last: float | None
    reward_all_mean: float | None
    loss_last: float | None
    staleness_mean: float | None
    staleness_max: int
    partial_rollouts: int
    engine_idle_frac: float | None
    weight_sync_s: float | None
    train_s: float | None
    train_tokens_per_s: float | None
    role_switches: int
    wall_s: float
    this_attempt_s: float
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    trainer_ranks: int
    single_sample_share: float | None = None  # over the run's finished rollouts with samples
    samples_per_rollout_mean: float | None = None
    # the replies (gateway/replies.py) of the first and the last step that had any
    mean_reply_tokens_first: float | None = None
    mean_reply_tokens_last: float | None = None
    length_finish_share_first: float | None = None
    length_finish_share_last: float | None = None
    distinct_2_first: float | None = None
    distinct_2_last: float | None = None
    lora_rank: int = 0  # 0: every weight trained; else the rank of the LoRA adapters trained
    weight_sync_bytes: float | None = None  # per sync: every weight, or the adapter alone

    def to_dict(self) -> dict[str, Any]:
        return strict_json(asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RLSummary:
        values: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        return cls(**values)


def summarize(
    records: list[StepRecord],
    mode: str,
    groups_started: int,
    attempt_s: float,
    rates: EngineRates,
    trainer_ranks: int,
    lora_rank: int = 0,
) -> RLSummary:
    trained = [r for r in records if r.update is not None]
    updates = [r.update for r in trained if r.update is not None]

    def mean(values: list[float | None]) -> float | None:
        return stats([float(v) for v in values if v is not None and math.isfinite(v)])["mean"]

    last = records[-1] if records else None
    sampled = sum(r.collected.sampled_rollouts for r in records)

    def first_last(figure: str) -> tuple[float | None, float | None]:
        """A reply figure of the first and the last step that had it."""
        values = [v for r in records if (v := getattr(r.replies, figure)) is not None]
        return (values[0], values[-1]) if values else (None, None)

    tokens = first_last("mean_reply_tokens")
    cut = first_last("length_finish_share")
    distinct = first_last("distinct_2")
    return RLSummary(
        mode=mode,
        steps=len(records),
        steps_trained=len(trained),
        version=last.version if last else 0,
        groups_trained=sum(u.groups_trained for u in updates),
        groups_zero_variance=sum(r.collected.groups_zero_variance for r in records),
        groups_stale_dropped=sum(r.collected.groups_stale_dropped for r in records),
        groups_skipped_dynamic=sum(len(r.collected.groups_skipped) for r in records),
        groups_started=groups_started,
        reward_first=updates[0].reward_mean if updates else None,
        reward_last=updates[-1].reward_mean if updates else None,
        reward_all_mean=mean([r.collected.reward_all_mean for r in records]),
        loss_last=trained[-1].loss if trained else None,
        staleness_mean=mean([u.staleness_mean for u in updates]),
        staleness_max=max((u.staleness_max for u in updates), default=0),
        partial_rollouts=sum(u.partial_rollouts for u in updates),
        engine_idle_frac=mean([r.engine_idle_frac for r in records]),
        weight_sync_s=mean([r.weight_sync_s for r in trained]),
        train_s=mean([u.train_s for u in updates]),
        train_tokens_per_s=mean([u.trainer.get("tokens_per_s") for u in updates]),
        role_switches=sum(r.collected.role_switches for r in records),
        wall_s=last.wall_s if last else attempt_s,
        this_attempt_s=attempt_s,
        decode_tokens_per_s=rates.decode_tokens_per_s,
        prefill_tokens_per_s=rates.prefill_tokens_per_s,
        trainer_ranks=trainer_ranks,
        single_sample_share=(
            sum(r.collected.single_sample_rollouts for r in records) / sampled if sampled else None
        ),
        samples_per_rollout_mean=(
            sum(r.collected.samples_collected for r in records) / sampled if sampled else None
        ),
        mean_reply_tokens_first=tokens[0],
        mean_reply_tokens_last=tokens[1],
        length_finish_share_first=cut[0],
        length_finish_share_last=cut[1],
        distinct_2_first=distinct[0],
        distinct_2_last=distinct[1],
        lora_rank=lora_rank,
        weight_sync_bytes=mean([r.weight_sync_bytes for r in trained]),
    )
