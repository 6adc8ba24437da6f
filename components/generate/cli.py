"""`harnessrl stage generate`: the generate stage on local files (same code the KFP component runs)."""

from __future__ import annotations

import argparse
import json
import sys

from components.flags import add_concurrency, add_out, add_policy, add_specs, add_tasks
from harnessrl.gateway.toolcalls import ToolParser
from harnessrl.rollout.config import FailedSamples
from harnessrl.rollout.executors import ExecutorName


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Which model the rollouts sample from: `--policy` (the checkpoint being trained) or `--engine-url`."""
    add_policy(
        p,
        help="HF model directory (checkpoint) served by the local engine "
        "(default: the tiny embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--engine-url",
        help="use a remote token-level engine (vLLM pool / engine server) instead; "
        "--policy then only supplies the tokenizer",
    )
    p.add_argument("--max-batch", type=int, default=16, help="local engine: requests decoded together")
    p.add_argument(
        "--tool-parser",
        type=ToolParser,
        choices=list(ToolParser),
        help="tool-call format the gateway parses (default: read off the model's chat template, else hermes)",
    )


def add_generate_args(p: argparse.ArgumentParser) -> None:
    add_tasks(p, help="task-set directory (tasks.jsonl + repos/)")
    add_specs(
        p,
        help="JSON file, or the JSON itself: one HarnessSpec or a list (assigned round-robin per rollout); "
        "default: the react harness in bubblewrap",
    )
    add_concurrency(p)
    p.add_argument(
        "--executor",
        type=ExecutorName,
        choices=list(ExecutorName),
        default=ExecutorName.THREADS,
        help="where rollouts run: threads in this process, or Ray tasks (local Ray when RAY_ADDRESS "
        "is unset, else that cluster, e.g. ray://harnessrl-ray-head-svc.harnessrl:10001)",
    )
    p.add_argument("--ray-cpus", type=float, default=0.5, help="ray: CPUs reserved per rollout task")
    p.add_argument("--max-tasks", type=int, help="only the first N tasks")
    p.add_argument("--instance-ids", nargs="+", help="only these tasks")
    p.add_argument(
        "--allow-unsandboxed",
        action="store_true",
        help="permit specs with sandbox 'local' (agent commands run unisolated; debugging only)",
    )
    p.add_argument(
        "--keep-workspaces", action="store_true", help="keep final workspaces under OUT/workspaces"
    )
    p.add_argument("--seed", type=int, default=0)
    add_model_args(p)


def register(commands, stages) -> None:
    p = stages.add_parser(
        "generate",
        help="rollouts: tasks × N through harness ↔ gateway ↔ engine",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_generate_args(p)
    p.add_argument("--group-size", type=int, default=4, help="rollouts per task (N)")
    p.add_argument(
        "--failed-samples",
        type=FailedSamples,
        choices=list(FailedSamples),
        default=FailedSamples.KEEP,
        help="samples of non-ok rollouts: keep them (with rollout_status; the trainer masks/drops) "
        "or leave them out of samples.parquet",
    )
    add_out(p, "replaced atomically")
    p.set_defaults(func=_run)


def model_from_args(args):
    from harnessrl.rollout.model_server import ModelSource

    return ModelSource(
        checkpoint=args.policy,
        engine_url=args.engine_url,
        max_batch=args.max_batch,
        tool_parser=getattr(args, "tool_parser", None),
    )


def config_from_args(args, group_size: int):
    from harnessrl.rollout.config import GenerateConfig

    return GenerateConfig(
        group_size=group_size,
        concurrency=args.concurrency,
        max_tasks=args.max_tasks,
        instance_ids=args.instance_ids,
        allow_unsandboxed=args.allow_unsandboxed,
        keep_workspaces=args.keep_workspaces,
        seed=args.seed,
        executor=args.executor,
        ray_cpus=args.ray_cpus,
        failed_samples=getattr(args, "failed_samples", FailedSamples.KEEP),
    )


def _run(args) -> int:
    from harnessrl.rollout.generate import run_generate

    metrics = run_generate(
        args.tasks,
        args.out,
        args.specs,
        model_from_args(args),
        config_from_args(args, args.group_size),
    )
    print(
        json.dumps(
            {
                k: metrics[k]
                for k in (
                    "rollouts",
                    "tasks",
                    "status",
                    "finish_reasons",
                    "records",
                    "samples",
                    "samples_per_rollout_mean",
                    "single_sample_share",
                    "rollouts_per_hour",
                )
            }
        )
    )
    print(f"wrote {args.out}/rollouts.jsonl, records.parquet, samples.parquet, report.md", file=sys.stderr)
    return 0
