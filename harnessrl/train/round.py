"""`train` stage: samples + rewards + policy checkpoint → new checkpoint, metrics, report.

Flow: load & join (data.py) → dynamic sampling (difficulty/history.py) → rollout-level advantages (advantages.py)
→ plan optimizer steps at group granularity (all samples of a rollout, indeed of a group, share one
step) → Trainer steps with global loss denominators → checkpoints every `save_every` steps → final model.
`resume=True` continues from the latest checkpoint of this run (same fingerprint, see fingerprint.py) in
`<out>/checkpoints` and reproduces an uninterrupted run exactly on CPU (same seed, same inputs → same losses).
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.choices import parse_choice
from harnessrl.difficulty.history import PassRateHistory
from harnessrl.harness.base import RolloutStatus
from harnessrl.io import atomic_write_json, write_jsonl
from harnessrl.progress import ProgressBar
from harnessrl.train import advantages as adv_mod
from harnessrl.train import distributed as dist_mod
from harnessrl.train.batching import SeqItem
from harnessrl.train.checkpoint import (
    check_checkpoints,
    clean_checkpoints,
    fetch_policy,
    load_checkpoint_state,
    save_checkpoint,
    save_model,
    sweep_partials,
    upload_dir,
)
from harnessrl.train.data import Prepared, Rollout, assemble, load_rewards, load_samples
from harnessrl.train.fingerprint import run_identity
from harnessrl.train.losses import sequence_weights
from harnessrl.train.modes import AdvantageLevel, Estimator, NonOkHandling, SingletonHandling
from harnessrl.train.report import write_report
from harnessrl.train.summary import stats, strict_json, summarize
from harnessrl.train.trainer import Trainer, TrainerConfig, seed_everything

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """The train stage's settings (the `--config` JSON); `train` holds the optimizer-step settings."""

    train: TrainerConfig = field(default_factory=TrainerConfig)
    estimator: Estimator = Estimator.GRPO
    advantage_level: AdvantageLevel = AdvantageLevel.ROLLOUT  # SAMPLE is an ablation
    adv_eps: float = 1e-6
    singleton: SingletonHandling = SingletonHandling.ZERO
    nonok: NonOkHandling = NonOkHandling.DROP  # see data.py
    mask_reward: float = 0.0
    ok_statuses: tuple[RolloutStatus, ...] = (RolloutStatus.OK,)  # rewarded; the others follow `nonok`
    groups_per_step: int = 0  # 0 = every group in one optimizer step
    epochs: int = 1
    drop_zero_variance: bool = True
    history: str | None = None  # pass-rate history JSONL
    history_last_k: int = 3
    record_round: int | None = None  # append this round's pass counts to `history`
    pass_threshold: float = 1.0  # reward ≥ this counts as a pass in the history
    save_every: int = 0  # checkpoint every N steps (0: only the final model)
    keep_checkpoints: int = 2
    max_steps: int | None = None
    device: str = "auto"
    # CPU threads for torch (0: every core). Set by the run itself, never inherited from whatever ran before
    # in the process: the thread count decides the order of float reductions, so a resumed run repeats the
    # interrupted one bit for bit only at the same count.
    threads: int = 0
    reference_kl: bool = False  # a frozen copy of the input policy as KL reference (needs policy.kl_coef > 0)

    def __post_init__(self) -> None:
        self.estimator = parse_choice(Estimator, self.estimator, "estimator")
        self.advantage_level = parse_choice(AdvantageLevel, self.advantage_level, "advantage_level")
        self.singleton = parse_choice(SingletonHandling, self.singleton, "singleton")
        self.nonok = parse_choice(NonOkHandling, self.nonok, "nonok")
        self.ok_statuses = tuple(parse_choice(RolloutStatus, s, "ok_statuses") for s in self.ok_statuses)
        if self.epochs < 1 or self.groups_per_step < 0 or self.threads < 0:
            raise ValueError("epochs must be ≥ 1, groups_per_step ≥ 0 and threads ≥ 0")
        if self.record_round is not None and not self.history:
            raise ValueError("record_round needs history (the pass-rate history JSONL to record into)")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        d = dict(d)
        train = TrainerConfig.from_dict(d.pop("train", {}))
        if "ok_statuses" in d:
            d["ok_statuses"] = tuple(d["ok_statuses"])
        return cls(train=train, **d)


@dataclass
class Plan:
    rollouts: list[Rollout]
    advantages: dict[str, float]  # rollout_id (or sample_id at sample level) → advantage
    steps: list[list[str]]  # group ids per optimizer step
    counts: dict[str, float]


def plan_round(prepared: Prepared, cfg: TrainConfig) -> Plan:
    counts: dict[str, float] = {f"excluded_{k}": v for k, v in prepared.excluded.items()}
    counts.update({f"masked_{k}": v for k, v in prepared.masked.items()})
    rollouts = prepared.rollouts
    groups = sorted({r.group_id for r in rollouts})
    counts["groups_in"] = len(groups)
    counts["rollouts_in"] = len(rollouts)
    skip: set[str] = set()
    if cfg.history:
        # this round's own row (from an earlier run of it) is not "history"
        skip = PassRateHistory(cfg.history).skip_for_dynamic_sampling(cfg.history_last_k, cfg.record_round)
        skip &= set(groups)
    counts["groups_skipped_history"] = len(skip)
    rollouts = [r for r in rollouts if r.group_id not in skip]
    if cfg.advantage_level == AdvantageLevel.ROLLOUT:
        advs, st = adv_mod.rollout_level(
            {r.rollout_id: (r.group_id, r.reward) for r in rollouts},
            cfg.estimator,
            cfg.adv_eps,
            cfg.singleton,
        )
    else:
        advs, st = adv_mod.sample_level(
            ((s.sample_id, r.group_id, r.reward) for r in rollouts for s in r.samples),
            cfg.estimator,
            cfg.adv_eps,
            cfg.singleton,
        )
    counts["groups_zero_variance"] = st.zero_variance_groups
    counts["groups_singleton"] = st.singleton_groups
    zero_var: set[str] = set()
    if cfg.drop_zero_variance:
        by_group: dict[str, set[float]] = defaultdict(set)
        for r in rollouts:
            by_group[r.group_id].add(r.reward)
        zero_var = {g for g, rs in by_group.items() if len(rs) == 1}
    rollouts = [r for r in rollouts if r.group_id not in zero_var]
    counts["groups_skipped_zero_variance"] = len(zero_var)
    trained_groups = sorted({r.group_id for r in rollouts if r.trainable})
    counts["groups_trained"] = len(trained_groups)
    counts["rollouts_trained"] = sum(r.trainable for r in rollouts)
    counts["samples_trained"] = sum(len(r.samples) for r in rollouts if r.trainable)
    steps: list[list[str]] = []
    per = cfg.groups_per_step or max(len(trained_groups), 1)
    for epoch in range(cfg.epochs):
        order = list(trained_groups)
        random.Random(cfg.train.seed * 1000003 + epoch).shuffle(order)
        steps += [order[i : i + per] for i in range(0, len(order), per)]
    return Plan(rollouts=rollouts, advantages=advs, steps=steps, counts=counts)


def step_items(plan: Plan, group_ids: list[str], cfg: TrainConfig) -> tuple[list[SeqItem], list[Rollout]]:
    gset = set(group_ids)
    members = [r for r in plan.rollouts if r.group_id in gset and r.trainable]
    seqs = [(r, s) for r in members for s in r.samples]
    counts = [sum(s.loss_mask[1:]) for _, s in seqs]
    weights = sequence_weights(
        counts, [r.rollout_id for r, _ in seqs], cfg.train.loss_mode, cfg.train.loss_scale_factor
    )
    items = []
    for (r, s), w in zip(seqs, weights, strict=True):
        a = plan.advantages[r.rollout_id if cfg.advantage_level == AdvantageLevel.ROLLOUT else s.sample_id]
        items.append(
            SeqItem(list(s.input_ids), list(s.loss_mask), list(s.behavior_logprobs), a, w, r.rollout_id)
        )
    return items, members


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run_train(
    samples: str | Path,
    rewards: str | Path | None,
    policy: str | Path,
    out: str | Path,
    cfg: TrainConfig | None = None,
    *,
    resume: bool = False,
    model_out: str | Path | None = None,
    upload_to: str | None = None,
) -> dict:
    """Runs the stage; writes <out>/{model/,checkpoints/,metrics.json,steps.jsonl,report.md,curves.png}.

    Returns the summary metrics (also in metrics.json).
    """
    import torch

    from harnessrl.tinymodel import load_model, load_tokenizer

    cfg = cfg or TrainConfig()
    out = Path(out)
    model_out = Path(model_out) if model_out else out / "model"
    ckpt_root = out / "checkpoints"
    ctx = dist_mod.init_from_env(_device(cfg.device))
    device = ctx.device
    if str(device).startswith("cpu"):
        torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    main = ctx.is_main
    try:
        policy_given = str(policy)
        if policy_given.startswith("s3://"):
            if main:
                fetch_policy(policy_given, out / "policy_in")
            dist_mod.barrier()
            policy = out / "policy_in"
        policy = Path(policy)
        if not (policy / "config.json").is_file():
            raise FileNotFoundError(f"{policy}: not a Hugging Face model directory (no config.json)")
        prepared = assemble(
            load_samples(samples),
            load_rewards(rewards) if rewards else None,
            nonok=cfg.nonok,
            mask_reward=cfg.mask_reward,
            ok_statuses=frozenset(cfg.ok_statuses),
        )
        plan = plan_round(prepared, cfg)
        # the plan (and the fingerprint) cover the whole round; max_steps only stops early
        steps = plan.steps[: cfg.max_steps]
        identity = run_identity(prepared, plan, cfg, policy, policy_given)
        fp = identity.digest
        ckpt = check_checkpoints(ckpt_root, identity, resume=resume)  # every rank, before rank 0 cleans
        dist_mod.barrier()
        if main:
            clean_checkpoints(ckpt_root, identity, resume=resume)
            sweep_partials(model_out.parent, re.escape(model_out.name), fp)
        dist_mod.barrier()
        if main:
            logger.info(
                "%d rollouts in, %d trained in %d groups over %d optimizer steps; counts %s",
                plan.counts["rollouts_in"],
                plan.counts["rollouts_trained"],
                plan.counts["groups_trained"],
                len(steps),
                plan.counts,
            )
        if main and cfg.history and cfg.record_round is not None:
            _record_history(prepared, cfg.history, cfg.record_round, cfg.pass_threshold)

        seed_everything(cfg.train.seed)
        start_step = 0
        history: list[dict] = []
        source = ckpt if ckpt is not None else policy
        tokenizer = load_tokenizer(policy)
        model: PreTrainedModel = load_model(source)
        # PreTrainedModel.to is decorated with functools.wraps(nn.Module.to), which pyright misreads
        model.to(device)  # pyright: ignore[reportArgumentType]
        if ctx.enabled:
            dist_mod.wrap_fsdp(model)
        ref_model: PreTrainedModel | None = None
        if cfg.reference_kl and cfg.train.policy.kl_coef > 0:  # frozen, so every rank holds a full copy
            ref_model = load_model(policy)
            ref_model.to(device)  # pyright: ignore[reportArgumentType]
            ref_model.eval().requires_grad_(False)
        pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        )
        trainer = Trainer(model, cfg.train, ref_model=ref_model, device=device, pad_id=pad_id)
        if ckpt is not None:
            state, meta = load_checkpoint_state(ckpt)
            trainer.load_state_dict(state)
            start_step = int(meta["step"])
            history = list(meta.get("history", []))
            if main:
                logger.info("resuming from %s: step %d of %d", ckpt, start_step, len(steps))

        reward_by_rollout = {r.rollout_id: r.reward for r in plan.rollouts}
        with ProgressBar("GRPO steps", total=len(steps), completed=start_step, transient=True) as bar:
            for step_index in range(start_step, len(steps)):
                items, members = step_items(plan, steps[step_index], cfg)
                m: dict[str, Any] = dict(trainer.step(dist_mod.shard_items(items, ctx.rank, ctx.world_size)))
                rewards_step = [reward_by_rollout[r.rollout_id] for r in members]
                advs_step = [it.advantage for it in items]
                m.update(
                    {
                        "reward_mean": stats(rewards_step)["mean"],
                        "reward_std": stats(rewards_step)["std"],
                        "adv_mean": stats(advs_step)["mean"],
                        "adv_std": stats(advs_step)["std"],
                        "adv_abs_max": max((abs(a) for a in advs_step), default=0.0),
                        "rollouts": len(members),
                        "groups": len(steps[step_index]),
                        "world_size": ctx.world_size,
                    }
                )
                history.append(strict_json(m))
                done = step_index + 1
                if cfg.save_every and done % cfg.save_every == 0 and done < len(steps):
                    weights = dist_mod.full_state_dict(model) if ctx.enabled else None  # collective
                    tstate = trainer.state_dict()  # collective under FSDP
                    if main:
                        save_checkpoint(
                            ckpt_root,
                            done,
                            model,
                            tokenizer,
                            tstate,
                            {**identity.to_meta(), "history": history, "config": cfg.to_dict()},
                            keep=cfg.keep_checkpoints,
                            state_dict=weights,
                        )
                    dist_mod.barrier()
                if main:
                    write_jsonl(out / "steps.jsonl", history)
                bar.advance()

        summary = summarize(plan, history)
        summary["fingerprint"] = fp
        summary["world_size"] = ctx.world_size
        weights = dist_mod.full_state_dict(model) if ctx.enabled else None
        if main:
            save_model(
                model,
                tokenizer,
                model_out,
                fp,
                state_dict=weights,
                extra_json={
                    "harnessrl_train.json": {
                        **identity.to_meta(),
                        "steps": len(history),
                        "config": cfg.to_dict(),
                        "world_size": ctx.world_size,
                    }
                },
            )
            if upload_to:
                upload_dir(model_out, upload_to)
            write_jsonl(out / "steps.jsonl", history)
            atomic_write_json(out / "metrics.json", summary)
            write_report(out, summary, history, cfg)
            logger.info("wrote %s after %d optimizer steps; metrics in %s", model_out, len(history), out)
        dist_mod.barrier()
        del model, trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return summary
    finally:
        if ctx.enabled:
            dist_mod.shutdown()


def _record_history(prepared: Prepared, history: str, round_: int, pass_threshold: float) -> None:
    n: Counter = Counter()
    passes: Counter = Counter()
    for r in prepared.rollouts:
        if not r.trainable:  # same rule as the difficulty store: only finished rollouts are evidence
            continue
        n[r.group_id] += 1
        passes[r.group_id] += int(r.reward >= pass_threshold)
    PassRateHistory(history).record_round(round_, {g: (n[g], passes[g]) for g in n})
