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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.difficulty.history import PassRateHistory
from harnessrl.io import atomic_write_json, write_jsonl
from harnessrl.progress import ProgressBar
from harnessrl.train import distributed as dist_mod
from harnessrl.train.checkpoint import (
    load_checkpoint_state,
    resolve_policy,
    save_checkpoint,
    save_model,
    start_run,
    upload_dir,
)
from harnessrl.train.config import UpdateConfig
from harnessrl.train.data import Prepared, load_rewards, load_samples
from harnessrl.train.fingerprint import run_identity
from harnessrl.train.lora import FINAL_ADAPTER, adapter_writer, base_name, load_trainable, merged_weights
from harnessrl.train.plan import Plan, plan_round, step_items
from harnessrl.train.report import write_report
from harnessrl.train.summary import stats, strict_json, summarize
from harnessrl.train.trainer import Trainer, seed_everything

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig(UpdateConfig):
    """The train stage's settings (the `--config` JSON): the update settings (harnessrl.train.config) and
    how this stage spreads one round over optimizer steps."""

    groups_per_step: int = 0  # 0 = every group in one optimizer step
    epochs: int = 1
    history: str | None = None  # pass-rate history JSONL (dynamic sampling over rounds)
    record_round: int | None = None  # append this round's pass counts to `history`
    max_steps: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.epochs < 1 or self.groups_per_step < 0:
            raise ValueError("epochs must be ≥ 1 and groups_per_step ≥ 0")
        if self.record_round is not None and not self.history:
            raise ValueError("record_round needs history (the pass-rate history JSONL to record into)")

    def plan(self, prepared: Prepared) -> Plan:
        """This round's optimizer steps: groups the pass-rate history says to skip are left out (this round's
        own row, from an earlier run of it, is not "history"), the rest spread over `groups_per_step` groups
        per step for `epochs` epochs."""
        skip: frozenset[str] = frozenset()
        if self.history:
            history = PassRateHistory(self.history)
            skip = frozenset(history.skip_for_dynamic_sampling(self.history_last_k, self.record_round))
        return plan_round(prepared, self, groups_per_step=self.groups_per_step, epochs=self.epochs, skip=skip)


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
    ctx = dist_mod.init_from_env(cfg.device)
    device = ctx.device
    if str(device).startswith("cpu"):
        torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    main = ctx.is_main
    try:
        given = str(policy)  # as the user gave it (an s3:// URI or a path), for the identity's messages
        policy_dir = resolve_policy(given, out, main=main, barrier=dist_mod.barrier)  # a bad one: first
        prepared = cfg.prepare(load_samples(samples), load_rewards(rewards) if rewards else None)
        plan = cfg.plan(prepared)
        # the plan (and the fingerprint) cover the whole round; max_steps only stops early
        steps = plan.steps[: cfg.max_steps]
        start = start_run(
            policy_dir,
            out,
            model_out,
            lambda policy_dir: run_identity(prepared, plan, cfg, policy_dir, given),
            resume=resume,
            main=main,
            barrier=dist_mod.barrier,
        )
        policy, identity, ckpt = start.policy_dir, start.identity, start.checkpoint
        fp = identity.digest
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
        lora = cfg.train.lora
        tokenizer = load_tokenizer(policy)
        model: PreTrainedModel = load_trainable(policy, ckpt, lora)
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
                        state = weights if weights is not None else model.state_dict()
                        save_checkpoint(
                            ckpt_root,
                            done,
                            model,
                            tokenizer,
                            tstate,
                            {**identity.to_meta(), "history": history, "config": cfg.to_dict()},
                            keep=cfg.keep_checkpoints,
                            state_dict=weights,
                            write_weights=adapter_writer(state, lora, base_name(given)),
                        )
                    dist_mod.barrier()
                if main:
                    write_jsonl(out / "steps.jsonl", history)
                bar.advance()

        summary = summarize(plan, history)
        summary["fingerprint"] = fp
        summary["world_size"] = ctx.world_size
        summary["precision"] = str(trainer.precision)  # what `auto` picked on this host
        weights = dist_mod.full_state_dict(model) if ctx.enabled else None
        if main:
            state = weights if weights is not None else model.state_dict()
            save_model(
                model,
                tokenizer,
                model_out,
                fp,
                state_dict=dict(merged_weights(state.items(), lora)) if lora.enabled else weights,
                write_extra=adapter_writer(state, lora, base_name(given), FINAL_ADAPTER),
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
