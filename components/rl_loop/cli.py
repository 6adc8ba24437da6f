"""`harnessrl stage rl`: the RL loop on local files (same code the KFP component `rl_loop` runs).

One process runs the engine(s), the gateway, rollout workers, verifiers and the trainer for --steps
optimizer steps. Prints one line per step (`rl step=… reward_mean=… …`) and, at the end, one JSON summary.
With --nproc N the stage runs under torchrun: rank 0 runs the loop, and the trainer is sharded over all N
ranks (FSDP2; one GPU per rank, or gloo on CPU). Across nodes, run the same command on each node with
--nnodes M, its --node-rank and node 0's --master-addr: node 0 runs the loop, the others only trainer ranks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from components.flags import (
    add_concurrency,
    add_config,
    add_model_out,
    add_out,
    add_policy,
    add_specs,
    add_tasks,
)
from harnessrl.engine.base import DType, WeightSyncMode
from harnessrl.rl.admission import StalePolicy
from harnessrl.rl.modes import RLMode, RolloutWorkers, TrainerNodes, WorkloadKind
from harnessrl.train.modes import Estimator

if TYPE_CHECKING:
    from harnessrl.rl.config import RLConfig


def register(commands, stages) -> None:
    p = stages.add_parser(
        "rl",
        help="the RL loop: generate, verify, train and sync weights for N steps (sync / colocated / separate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_tasks(p, help="task-set directory (swe) or prompt JSONL (--workload prompt)")
    add_out(p, "model/, checkpoints/, steps.jsonl, ...")
    p.add_argument("--workload", choices=list(WorkloadKind), default=WorkloadKind.SWE)
    add_policy(p, help="HF model directory or s3:// URI (default: the tiny embedded model)")
    add_specs(p, help="harness spec JSON file (swe workload)")
    p.add_argument(
        "--engine-url", action="append", default=[], help="remote engine (repeat for several replicas)"
    )
    add_config(p, "RLConfig")
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
    add_concurrency(p, default=None, help="rollouts in flight (default: by mode)")
    p.add_argument("--save-every", type=int)
    p.add_argument("--replicas", type=int, help="local engine replicas behind the router")
    p.add_argument(
        "--rollout-workers",
        choices=list(RolloutWorkers),
        help="where rollouts run: threads of this process (default) or ray (tasks across the cluster of "
        "RAY_ADDRESS, or a local one)",
    )
    p.add_argument("--nproc", type=int, help="trainer ranks on this node (torchrun; one GPU each); default 1")
    p.add_argument(
        "--max-restarts",
        type=int,
        help="with trainer ranks: restarts after a rank fails, each resumed from the newest checkpoint; default 2",
    )
    p.add_argument(
        "--nnodes", type=int, help="nodes the trainer ranks span (each runs this command); default 1"
    )
    p.add_argument(
        "--node-rank", type=int, default=0, help="this node's place (0: the loop's node); default 0"
    )
    p.add_argument(
        "--trainer-nodes",
        choices=list(TrainerNodes),
        default=TrainerNodes.MANUAL,
        help="who starts the other nodes: manual (each runs this command) or ray (node 0 places them as Ray "
        "tasks on other Ray nodes, RAY_ADDRESS)",
    )
    p.add_argument("--master-addr", default="127.0.0.1", help="node 0's address, as every node reaches it")
    p.add_argument("--master-port", type=int, default=29500, help="node 0's rendezvous port; default 29500")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--engine-dtype",
        choices=list(DType),
        help="local engine weights' format (auto: what this host multiplies faster); default float32",
    )
    p.add_argument("--lr", type=float)
    p.add_argument(
        "--lora-rank",
        type=int,
        help="train LoRA adapters of this rank instead of every weight (train.lora; docs/train.md)",
    )
    p.add_argument("--estimator", choices=list(Estimator), help="advantage estimator (default: grpo)")
    p.add_argument(
        "--env",
        dest="environments",
        action="append",
        help="train only on the task set's tasks of this environment (repeat for several; default: every task)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT")
    add_model_out(p)
    p.add_argument("--upload-to", help="s3://bucket/prefix for checkpoints and the final model")
    p.add_argument("--allow-unsandboxed", action="store_true", help="permit specs with sandbox 'local'")
    p.set_defaults(func=_run)


def build_config(args: argparse.Namespace) -> RLConfig:
    from components.rl_loop.stage import build_config as settings

    config = json.loads(Path(args.config).read_text()) if args.config else {}
    overrides = {key: getattr(args, key) for key in FLAGS}
    overrides["allow_unsandboxed"] = True if args.allow_unsandboxed else None
    return settings(config, overrides, lr=args.lr, lora_rank=args.lora_rank)


# RLConfig fields with a flag of the same name (--batch-groups: batch_groups)
FLAGS = (
    "mode",
    "steps",
    "batch_groups",
    "group_size",
    "max_staleness",
    "stale_policy",
    "concurrency",
    "save_every",
    "replicas",
    "rollout_workers",
    "nproc",
    "nnodes",
    "max_restarts",
    "seed",
    "weight_sync",
    "engine_dtype",
    "estimator",
    "environments",
)


def _run(args: argparse.Namespace) -> int:
    from components.rl_loop.stage import run_stage
    from harnessrl.cli import UserError
    from harnessrl.engine.base import EngineError
    from harnessrl.rl.config import RLInputs
    from harnessrl.rl.nodes import TrainerNodesError
    from harnessrl.rl.ranks import in_torchrun
    from harnessrl.train.distributed import Rendezvous
    from harnessrl.train.launch import RanksFailed, RanksStopped

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
        rendezvous=Rendezvous(args.node_rank, args.master_addr, args.master_port),
        trainer_nodes=TrainerNodes(args.trainer_nodes),
    )
    try:
        summary = run_stage(cfg, inputs, echo=lambda line: print(line, flush=True))
    except RanksFailed as e:
        first = e.failures[0] if e.failures else None
        if first is not None and first.rank == 0 and first.exitcode == 2:
            return 2  # rank 0 has already printed its `harnessrl: error: ...` line
        raise UserError(str(e)) from None
    except EngineError as e:  # e.g. WeightSyncUnsupported: one line naming the engine and the fix
        raise UserError(str(e)) from None
    except (RanksStopped, TrainerNodesError) as e:  # another node failed, or could not be placed
        raise UserError(str(e)) from None
    # this process ran the loop, or launched the ranks (rank 0's summary, printed once every rank ended)
    if summary is not None and not in_torchrun():
        print(json.dumps(summary.to_dict()))
    elif summary is None and inputs.rendezvous.node_rank:
        print(f"trainer node {inputs.rendezvous.node_rank} of {cfg.nnodes}: its ranks are done", flush=True)
    return 0
