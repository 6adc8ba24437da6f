"""`harnessrl stage estimate-difficulty` on local files."""

from __future__ import annotations

import argparse
import json

from components.flags import add_concurrency, add_out, add_specs, add_tasks
from harnessrl.rollout.executors import ExecutorName


def register(commands, stages) -> None:
    from components.generate.cli import add_model_args

    p = stages.add_parser(
        "estimate-difficulty",
        help="Best-of-N generate + verify per task → pass counts",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_tasks(p, help="task-set directory")
    add_out(p, "pass_counts.jsonl, history.jsonl, report.md, …")
    p.add_argument("--n", type=int, default=4, help="rollouts per task (Best-of-N)")
    add_specs(p, help="harness spec JSON (see `harnessrl stage generate --help`)")
    add_concurrency(p)
    p.add_argument(
        "--executor",
        type=ExecutorName,
        choices=list(ExecutorName),
        default=ExecutorName.THREADS,
        help="where rollouts run (see `harnessrl stage generate --help`)",
    )
    p.add_argument("--ray-cpus", type=float, default=0.5, help="ray: CPUs reserved per rollout task")
    p.add_argument("--verify-workers", type=int, default=2)
    p.add_argument("--max-tasks", type=int)
    p.add_argument("--round", type=int, default=0, help="history round these counts are recorded as")
    p.add_argument("--allow-unsandboxed", action="store_true")
    add_model_args(p)
    p.set_defaults(func=_estimate)


def _estimate(args) -> int:
    from components.estimate_difficulty.stage import run_estimate
    from components.generate.cli import model_from_args

    metrics = run_estimate(
        args.tasks,
        args.out,
        n=args.n,
        specs=args.specs,
        model=model_from_args(args),
        concurrency=args.concurrency,
        verify_workers=args.verify_workers,
        max_tasks=args.max_tasks,
        history_round=args.round,
        allow_unsandboxed=args.allow_unsandboxed,
        executor=args.executor,
        ray_cpus=args.ray_cpus,
    )
    print(json.dumps(metrics))
    return 0
