"""`harnessrl stage sft`: cold-start supervised fine-tuning on resolved trajectories (scripted demonstrations
of each task's gold fix and/or verified-resolved rollouts of an earlier run), loss only on sampled tokens."""

from __future__ import annotations

import argparse
import json

from components.flags import add_config, add_model_out, add_out, add_policy, add_specs, add_tasks
from harnessrl.train.modes import Precision, SftSource


def register(commands, stages) -> None:
    p = stages.add_parser(
        "sft",
        help="cold start: SFT on demonstrations / resolved rollouts → new checkpoint, metrics, report",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_tasks(p, help="task-set directory (the training tasks)")
    add_policy(p)
    add_out(p, "model/, data/, demos/, train/, report.md")
    p.add_argument("--source", type=SftSource, choices=list(SftSource), help="default: demonstrations")
    p.add_argument("--rollouts", help="rejection sampling: an earlier generate output (samples.parquet)")
    p.add_argument("--verified", help="rejection sampling: that run's verify output (rewards.jsonl)")
    add_specs(p, help="harness spec JSON for the demonstrations (react with edit + submit)")
    add_config(p, "SftConfig")
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--groups-per-step", type=int, help="tasks per optimizer step (0: all)")
    p.add_argument("--max-tasks", type=int, help="demonstrations for the first N tasks only")
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", choices=list(Precision))
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train/checkpoints")
    add_model_out(p)
    p.add_argument(
        "--allow-unsandboxed", action="store_true", help="permit specs with sandbox 'local' (debugging only)"
    )
    p.set_defaults(func=_run)


def build_config(args):
    from components.flags import config_with_flags
    from components.sft.stage import SftConfig

    base = config_with_flags(
        args, top=("source", "epochs", "groups_per_step", "max_tasks", "device"), train=("seed", "precision")
    )
    try:
        return SftConfig.from_dict(base)
    except TypeError as e:
        raise ValueError(f"{args.config or 'config'}: {e}") from None


def _run(args) -> int:
    from components.sft.stage import run_sft
    from harnessrl.tinymodel import tiny_model_dir

    summary = run_sft(
        args.tasks,
        args.policy or tiny_model_dir(),
        args.out,
        build_config(args),
        rollouts=args.rollouts,
        verified=args.verified,
        specs=args.specs,
        allow_unsandboxed=args.allow_unsandboxed,
        resume=args.resume,
        model_out=args.model_out,
    )
    keys = ("steps", "samples", "tasks", "loss_first", "loss")
    print(json.dumps({k: summary.get(k) for k in keys}))
    return 0
