"""`sft` stage (cold start): supervised fine-tuning on resolved trajectories in the gateway's sample format.

Trajectories come from scripted demonstrations of each task's gold fix (demos.py) and/or rejection
sampling (the verified-resolved rollouts of any earlier generate/evaluate run). Either way they are Sample
rows exactly as the gateway recorded them; the loss is the negative log-likelihood of the sampled tokens
only (the samples' loss mask), with the train stage's own machinery: `round.run_train` with
`TrainerConfig.objective = sft` (packing, precision, checkpoints and --resume, FSDP data parallelism, steps at
task granularity). No second trainer.

Outputs in `out/`: `data/` (the chosen samples.parquet + rewards.jsonl), `demos/` (the demonstrations'
generate and verify outputs), `train/` (the train stage's outputs), `model/`, `metrics.json`, `report.md`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.io import atomic_write_json, atomic_write_text, read_jsonl, write_jsonl
from harnessrl.rollout.specs import NamedSpec
from harnessrl.schema import RolloutStatus, Sample
from harnessrl.train.data import assemble, load_rewards, load_samples
from harnessrl.train.modes import LossMode, Objective, SftSource
from harnessrl.train.round import TrainConfig
from harnessrl.train.trainer import OptimConfig, TrainerConfig

logger = logging.getLogger(__name__)

DEMO_PREFIX = "demo/"  # rollout/sample ids of demonstrations, so they never collide with a run's ids
REJECTION_PREFIX = "rs/"


def _sft_trainer() -> TrainerConfig:
    return TrainerConfig(objective=Objective.SFT, loss_mode=LossMode.TOKEN_MEAN, optim=OptimConfig(lr=5e-5))


@dataclass
class SftConfig:
    """The sft stage's settings (`--config` JSON); `train` holds the optimizer-step settings."""

    source: SftSource = SftSource.DEMONSTRATIONS
    epochs: int = 3
    groups_per_step: int = 4  # tasks per optimizer step (all trajectories of a task share a step)
    min_reward: float = 1.0  # a rejection-sampled rollout is trained on when its reward is at least this
    max_tasks: int | None = None  # demonstrations for the first N tasks only
    concurrency: int = 2  # demonstration rollouts at once
    verify_workers: int = 2
    save_every: int = 0
    keep_checkpoints: int = 2
    device: str = "auto"
    threads: int = 0
    train: TrainerConfig = field(default_factory=_sft_trainer)

    def __post_init__(self) -> None:
        self.source = parse_choice(SftSource, self.source, "source")
        if self.train.objective is not Objective.SFT:
            raise ValueError(f"train.objective must be {Objective.SFT!r} in the sft stage")
        if self.epochs < 1 or self.groups_per_step < 0:
            raise ValueError("epochs must be ≥ 1 and groups_per_step ≥ 0")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SftConfig:
        d = dict(d)
        train = {**_sft_trainer().to_dict(), **d.pop("train", {})}
        train.setdefault("objective", Objective.SFT)
        return cls(train=TrainerConfig.from_dict(train), **d)

    def train_config(self) -> TrainConfig:
        """The train stage's settings for this run: every trajectory trains (no zero-variance skipping)."""
        return TrainConfig(
            train=self.train,
            epochs=self.epochs,
            groups_per_step=self.groups_per_step,
            drop_zero_variance=False,
            save_every=self.save_every,
            keep_checkpoints=self.keep_checkpoints,
            device=self.device,
            threads=self.threads,
        )


@dataclass
class Trajectories:
    samples: list[Sample]
    counts: dict[str, Any]  # per source: rollouts in, resolved rollouts kept, samples, tasks


def resolved_samples(
    samples: str | Path, rewards: str | Path, prefix: str, min_reward: float = 1.0
) -> tuple[list[Sample], dict[str, int]]:
    """The samples of rollouts whose verified reward is ≥ min_reward (status ok), ids prefixed."""
    prepared = assemble(load_samples(samples), load_rewards(rewards))
    kept = [r for r in prepared.rollouts if r.trainable and r.reward >= min_reward]
    out = [
        replace(
            s,
            sample_id=prefix + s.sample_id,
            rollout_id=prefix + s.rollout_id,
            reward=r.reward,
            rollout_status=RolloutStatus.OK,
        )
        for r in kept
        for s in r.samples
    ]
    counts = {
        "rollouts": len(prepared.rollouts) + sum(prepared.excluded.values()),
        "resolved": len(kept),
        "samples": len(out),
        "tasks": len({r.group_id for r in kept}),
    }
    return out, counts


def collect(
    tasks: str | Path,
    policy: str | Path,
    out: str | Path,
    cfg: SftConfig,
    *,
    rollouts: str | Path | None = None,
    verified: str | Path | None = None,
    specs: list[NamedSpec] | str | Path | None = None,
    allow_unsandboxed: bool = False,
) -> Trajectories:
    """Gathers the trajectories the config's source asks for; writes `out/data/`."""
    from components.sft.demos import run_demonstrations
    from harnessrl.taskset import TaskSet

    out = Path(out)
    samples: list[Sample] = []
    counts: dict[str, Any] = {}
    if cfg.source in (SftSource.REJECTION, SftSource.BOTH):
        if rollouts is None or verified is None:
            raise ValueError(
                f"source {cfg.source!r} needs an earlier run's rollouts (generate's output: samples.parquet) "
                "and its verify output (rewards.jsonl); pass --rollouts and --verified, or use "
                f"--source {SftSource.DEMONSTRATIONS}"
            )
        got, counts["rejection"] = resolved_samples(rollouts, verified, REJECTION_PREFIX, cfg.min_reward)
        samples += got
    if cfg.source in (SftSource.DEMONSTRATIONS, SftSource.BOTH):
        ids = [r["instance_id"] for r in TaskSet.open(tasks).rows()][: cfg.max_tasks]
        run = run_demonstrations(
            tasks,
            out / "demos",
            policy,
            specs=specs,
            instance_ids=ids,
            concurrency=cfg.concurrency,
            verify_workers=cfg.verify_workers,
            allow_unsandboxed=allow_unsandboxed,
        )
        got, demo_counts = resolved_samples(run.rollouts, run.verified, DEMO_PREFIX, 1.0)
        counts["demonstrations"] = {**demo_counts, "built": len(run.built), "skipped": run.skipped}
        samples += got
    if not samples:
        raise ValueError(f"no resolved trajectory to train on ({counts}); nothing for SFT to learn from")
    data = out / "data"
    import pyarrow as pa
    import pyarrow.parquet as pq

    data.mkdir(parents=True, exist_ok=True)
    tmp = data / ".samples.parquet.tmp"
    pq.write_table(pa.Table.from_pylist([s.to_row() for s in samples]), tmp)
    tmp.replace(data / "samples.parquet")
    rewards = {s.rollout_id: s.reward for s in samples}
    write_jsonl(
        data / "rewards.jsonl",
        (
            {"rollout_id": rid, "reward": rw, "status": RolloutStatus.OK}
            for rid, rw in sorted(rewards.items())
        ),
    )
    return Trajectories(samples, counts)


def run_sft(
    tasks: str | Path,
    policy: str | Path,
    out: str | Path,
    cfg: SftConfig | None = None,
    *,
    rollouts: str | Path | None = None,
    verified: str | Path | None = None,
    specs: list[NamedSpec] | str | Path | None = None,
    allow_unsandboxed: bool = False,
    resume: bool = False,
    model_out: str | Path | None = None,
    nproc: int = 1,
) -> dict[str, Any]:
    """The whole stage; returns the summary (also `out/metrics.json`). `nproc` > 1: torchrun data parallel."""
    from harnessrl.train.launch import run_multiprocess
    from harnessrl.train.round import run_train

    cfg = cfg or SftConfig()
    out = Path(out)
    model_out = Path(model_out) if model_out else out / "model"
    found = collect(
        tasks,
        policy,
        out,
        cfg,
        rollouts=rollouts,
        verified=verified,
        specs=specs,
        allow_unsandboxed=allow_unsandboxed,
    )
    data, work = out / "data", out / "train"
    args = (data / "samples.parquet", data / "rewards.jsonl", policy, work, cfg.train_config())
    if nproc > 1:
        summary = run_multiprocess(nproc, *args, resume=resume, model_out=model_out)
    else:
        summary = run_train(*args, resume=resume, model_out=model_out)
    history = list(read_jsonl(work / "steps.jsonl")) if (work / "steps.jsonl").is_file() else []
    result = {
        "steps": summary.get("steps", 0),
        "loss_first": summary.get("loss_first"),
        "loss": summary.get("loss"),
        "trained_tokens": summary.get("trained_tokens"),
        "samples": len(found.samples),
        "tasks": len({s.group_id for s in found.samples}),
        "sources": found.counts,
        "source": cfg.source,
        "epochs": cfg.epochs,
        "fingerprint": summary.get("fingerprint", ""),
    }
    atomic_write_json(out / "metrics.json", result)
    atomic_write_text(out / "report.md", render_report(result, history, cfg))
    logger.info(
        "sft: %d samples of %d tasks, %d steps; model in %s",
        result["samples"],
        result["tasks"],
        result["steps"],
        model_out,
    )
    return result


def render_report(result: dict[str, Any], history: list[dict], cfg: SftConfig) -> str:
    from harnessrl.reports import code, embed_png, figure_png, new_figure

    lines = [
        "# SFT stage (cold start)",
        "",
        f"Source {code(cfg.source)}, {cfg.epochs} epoch(s), {cfg.groups_per_step or 'all'} task(s) per step, "
        f"loss {code(cfg.train.loss_mode)} NLL of the sampled tokens, lr {cfg.train.optim.lr}, "
        f"{cfg.train.precision}, seed {cfg.train.seed}.",
        "",
        "| source | rollouts | resolved (trained) | samples | tasks |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, c in result["sources"].items():
        lines.append(f"| {name} | {c['rollouts']} | {c['resolved']} | {c['samples']} | {c['tasks']} |")
    skipped = result["sources"].get("demonstrations", {}).get("skipped") or {}
    if skipped:
        lines += ["", f"{len(skipped)} task(s) without a demonstration:", ""]
        lines += [f"- {code(k)}: {v}" for k, v in sorted(skipped.items())]
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {code(k)} | {v} |" for k, v in result.items() if not isinstance(v, dict)]
    if history:
        fig, axes = new_figure(2.6)
        ax = axes[0][0]
        ax.plot([h["step"] for h in history], [h.get("loss") for h in history], marker="o", ms=3)
        ax.set_title("SFT loss (NLL per sampled token)", fontsize=10)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.grid(alpha=0.3)
        lines += ["", embed_png(figure_png(fig), "SFT loss curve")]
    return "\n".join(lines) + "\n"
