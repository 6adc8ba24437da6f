"""`harnessrl stage select` on local files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from components.flags import add_out, add_tasks


def register(commands, stages) -> None:
    s = stages.add_parser(
        "select",
        help="drop all-pass, keep mixed, add K all-fail, split train/test",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_tasks(s, help="the task set the estimates were made on")
    s.add_argument(
        "--estimates", required=True, help="estimate-difficulty output directory (or its pass_counts.jsonl)"
    )
    add_out(s, "train/, test/, selection.jsonl, report.md")
    s.add_argument("--k-all-fail", type=int, default=0, help="all-fail tasks to keep (seeded sample)")
    s.add_argument("--test-fraction", type=float, default=0.1)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_select)


def _select(args) -> int:
    from components.select_tasks.stage import run_select

    est = Path(args.estimates)
    counts = est / "pass_counts.jsonl" if est.is_dir() else est
    metrics = run_select(
        args.tasks,
        counts,
        args.out,
        k_all_fail=args.k_all_fail,
        test_fraction=args.test_fraction,
        seed=args.seed,
    )
    print(json.dumps(metrics))
    return 0
