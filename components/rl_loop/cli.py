"""`harnessrl stage rl`: the RL loop on local files (same code the KFP component `rl_loop` runs).

One process runs the engine(s), the gateway, rollout workers, verifiers and the trainer for --steps
optimizer steps. Prints one line per step (`rl step=… reward_mean=… …`) and, at the end, one JSON summary.
With --nproc N the stage runs under torchrun: rank 0 runs the loop, and the trainer is sharded over all N
ranks (FSDP2; one GPU per rank, or gloo on CPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harnessrl.rl.admission import StalePolicy
from harnessrl.rl.modes import RLMode, WeightSyncMode, WorkloadKind


def register(commands, stages) -> None:
    p = stages.add_parser(
        "rl",
        help="the RL loop: generate, verify, train and sync weights for N steps (sync / colocated / separate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--tasks", required=True, help="task-set directory (swe) or prompt JSONL (--workload prompt)"
    )
    p.add_argument("--out", required=True, help="output directory (model/, checkpoints/, steps.jsonl, ...)")
    p.add_argument("--workload", choices=list(WorkloadKind), default=WorkloadKind.SWE)
    p.add_argument("--policy", help="HF model directory or s3:// URI (default: the tiny embedded model)")
    p.add_argument("--specs", help="harness spec JSON file (swe workload)")
    p.add_argument(
        "--engine-url", action="append", default=[], help="remote engine (repeat for several replicas)"
    )
    p.add_argument("--config", help="JSON file with RLConfig fields (flags below override it)")
    p.add_argument("--mode", choices=list(RLMode))
    p.add_argument(
        "--weight-sync",
        choices=list(WeightSyncMode),
        help="how weights reach the engines: checkpoint (a path they read) or broadcast (default: checkpoint)",
    )
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-groups", type=int)
    p.add_argument("--group-size", type=int)
    p.add_argument("--max-staleness", type=int)
    p.add_argument("--stale-policy", choices=list(StalePolicy))
    p.add_argument("--concurrency", type=int, help="rollouts in flight (default: by mode)")
    p.add_argument("--save-every", type=int)
    p.add_argument("--replicas", type=int, help="local engine replicas behind the router")
    p.add_argument("--nproc", type=int, help="trainer ranks (torchrun; one GPU each); default 1")
    p.add_argument("--seed", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT")
    p.add_argument("--model-out", help="where to write the final model (default: OUT/model)")
    p.add_argument("--upload-to", help="s3://bucket/prefix for checkpoints and the final model")
    p.add_argument("--allow-unsandboxed", action="store_true", help="permit specs with sandbox 'local'")
    p.set_defaults(func=_run)


def build_config(args: argparse.Namespace):
    from harnessrl.rl.config import RLConfig

    base: dict = {}
    if args.config:
        base = json.loads(Path(args.config).read_text())
    for key in (
        "mode",
        "steps",
        "batch_groups",
        "group_size",
        "max_staleness",
        "stale_policy",
        "concurrency",
        "save_every",
        "replicas",
        "nproc",
        "seed",
        "weight_sync",
    ):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    if args.allow_unsandboxed:
        base["allow_unsandboxed"] = True
    if args.lr is not None:
        base.setdefault("train", {}).setdefault("train", {}).setdefault("optim", {})["lr"] = args.lr
    return RLConfig.from_dict(base)


def _run(args: argparse.Namespace) -> int:
    from harnessrl.cli import UserError
    from harnessrl.engine.base import EngineError
    from harnessrl.rl.loop import RLInputs, run_rl
    from harnessrl.rl.ranks import in_torchrun, launch
    from harnessrl.train.launch import RanksFailed

    cfg = build_config(args)
    inputs = RLInputs(
        WorkloadKind(args.workload),
        Path(args.tasks),
        Path(args.out),
        policy=args.policy,
        specs=args.specs,
        engine_urls=list(args.engine_url),
        resume=args.resume,
        model_out=Path(args.model_out) if args.model_out else None,
        upload_to=args.upload_to,
    )
    if cfg.nproc > 1 and not in_torchrun():
        try:  # the ranks print the step lines and the summary themselves
            launch(cfg, inputs)
        except RanksFailed as e:
            first = e.failures[0] if e.failures else None
            if first is not None and first.rank == 0 and first.exitcode == 2:
                return 2  # rank 0 has already printed its `harnessrl: error: ...` line
            raise UserError(str(e)) from None
        return 0
    try:
        summary = run_rl(cfg, inputs, echo=lambda line: print(line, flush=True))
    except EngineError as e:  # e.g. WeightSyncUnsupported: one line naming the engine and the fix
        raise UserError(str(e)) from None
    if summary:  # {} on trainer ranks other than 0
        print(json.dumps(summary))
    return 0
