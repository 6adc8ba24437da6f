"""`harnessrl stage estimate-difficulty` and `harnessrl stage select` on local files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(commands, stages) -> None:
    from harnessrl.components.rollout.cli import add_policy_args

    p = stages.add_parser("estimate-difficulty", help="Best-of-N generate + verify per task → pass counts",
                          description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tasks", required=True, help="task-set directory")
    p.add_argument("--out", required=True, help="output directory (pass_counts.jsonl, history.jsonl, report.md, …)")
    p.add_argument("--n", type=int, default=4, help="rollouts per task (Best-of-N)")
    p.add_argument("--specs", help="harness spec JSON (see `harnessrl stage generate --help`)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--executor", choices=["threads", "ray"], default="threads",
                   help="where rollouts run (see `harnessrl stage generate --help`)")
    p.add_argument("--ray-cpus", type=float, default=0.5, help="ray: CPUs reserved per rollout task")
    p.add_argument("--verify-workers", type=int, default=2)
    p.add_argument("--max-tasks", type=int)
    p.add_argument("--round", type=int, default=0, help="history round these counts are recorded as")
    p.add_argument("--allow-unsandboxed", action="store_true")
    p.add_argument("--quiet", action="store_true")
    add_policy_args(p)
    p.set_defaults(func=_estimate)

    s = stages.add_parser("select", help="drop all-pass, keep mixed, add K all-fail, split train/test",
                          description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--tasks", required=True, help="the task set the estimates were made on")
    s.add_argument("--estimates", required=True,
                   help="estimate-difficulty output directory (or its pass_counts.jsonl)")
    s.add_argument("--out", required=True, help="output directory: train/, test/, selection.jsonl, report.md")
    s.add_argument("--k-all-fail", type=int, default=0, help="all-fail tasks to keep (seeded sample)")
    s.add_argument("--test-fraction", type=float, default=0.1)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_select)


def _estimate(args) -> int:
    from harnessrl.components.difficulty.estimate import run_estimate
    from harnessrl.components.rollout.cli import policy_from_args

    metrics = run_estimate(args.tasks, args.out, n=args.n, specs=args.specs, policy=policy_from_args(args),
                           concurrency=args.concurrency, verify_workers=args.verify_workers,
                           max_tasks=args.max_tasks, history_round=args.round, progress=not args.quiet,
                           allow_unsandboxed=args.allow_unsandboxed, executor=args.executor,
                           ray_cpus=args.ray_cpus)
    print(json.dumps(metrics))
    return 0


def _select(args) -> int:
    from harnessrl.components.difficulty.select import run_select

    est = Path(args.estimates)
    counts = est / "pass_counts.jsonl" if est.is_dir() else est
    metrics = run_select(args.tasks, counts, args.out, k_all_fail=args.k_all_fail,
                         test_fraction=args.test_fraction, seed=args.seed)
    print(json.dumps(metrics))
    return 0
