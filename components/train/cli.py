"""`harnessrl stage train`: the train stage on local files (same code the KFP component runs)."""

from __future__ import annotations

import argparse
import json

from components.flags import add_config, add_model_out, add_out, add_policy, config_with_flags
from harnessrl.train.modes import AdvantageLevel, Estimator, LossMode, NonOkHandling, Precision


def register(commands, stages) -> None:
    p = stages.add_parser(
        "train",
        help="GRPO update: samples + rewards + policy → new checkpoint, metrics, report",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--samples", required=True, help="Parquet file or directory of Sample rows")
    p.add_argument(
        "--rewards",
        help="verify's JSONL (rollout_id, reward, status) file or directory; "
        "without it each sample's own reward/rollout_status is used",
    )
    add_policy(p)
    add_out(p, "model/, checkpoints/, metrics.json, report.md")
    p.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in OUT/checkpoints"
    )
    add_config(p, "TrainConfig")
    p.add_argument("--estimator", choices=list(Estimator))
    p.add_argument("--advantage-level", choices=list(AdvantageLevel))
    p.add_argument("--loss-mode", choices=list(LossMode))
    p.add_argument(
        "--nonok", choices=list(NonOkHandling), help="what to do with rollouts whose status is not ok"
    )
    p.add_argument("--lr", type=float)
    p.add_argument(
        "--lora-rank",
        type=int,
        help="train LoRA adapters of this rank instead of every weight (train.lora; docs/train.md)",
    )
    p.add_argument("--groups-per-step", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--save-every", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", choices=list(Precision))
    p.add_argument("--no-packing", action="store_true", help="padded micro-batches instead of packed")
    p.add_argument("--max-tokens-per-micro-batch", type=int)
    p.add_argument("--history", help="pass-rate history JSONL for dynamic sampling")
    p.add_argument("--record-round", type=int, help="append this round's pass counts to --history")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    add_model_out(p)
    p.add_argument(
        "--upload-to", help="s3://bucket/prefix to upload the final model to (via harnessrl.store)"
    )
    p.set_defaults(func=_run)


def build_config(args):
    from harnessrl.train.lora import with_lora_rank
    from harnessrl.train.round import TrainConfig

    base = config_with_flags(
        args,
        top=(
            "estimator",
            "advantage_level",
            "nonok",
            "groups_per_step",
            "epochs",
            "max_steps",
            "save_every",
            "history",
            "record_round",
            "device",
        ),
        train=("loss_mode", "seed", "precision", "max_tokens_per_micro_batch"),
    )
    if args.no_packing:
        base["train"]["packing"] = False
    try:
        return TrainConfig.from_dict(with_lora_rank(base, args.lora_rank))
    except TypeError as e:
        raise ValueError(f"{args.config or 'config'}: {e}") from None


def _is_worker_rank() -> bool:
    """Under torchrun only rank 0 reports."""
    import os

    return int(os.environ.get("RANK", "0")) != 0


def _run(args) -> int:
    from harnessrl.tinymodel import tiny_model_dir
    from harnessrl.train.round import run_train

    cfg = build_config(args)
    summary = run_train(
        args.samples,
        args.rewards,
        args.policy or tiny_model_dir(),
        args.out,
        cfg,
        resume=args.resume,
        model_out=args.model_out,
        upload_to=args.upload_to,
    )
    if _is_worker_rank():
        return 0
    keys = (
        "steps",
        "loss",
        "reward_mean",
        "entropy",
        "clip_frac",
        "grad_norm",
        "tokens_per_s",
        "padding_fraction",
    )
    print(json.dumps({k: summary.get(k) for k in keys}))
    return 0
