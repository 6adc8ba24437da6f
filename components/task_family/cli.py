"""`harnessrl stage task-family` on local files (same code the KFP component runs)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from components.flags import add_out
from components.task_family.stage import Family


def register(commands, stages) -> None:
    p = stages.add_parser(
        "task-family",
        help="the RL loop's training and held-out tasks: the selected SWE tasks or a generated family",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--selected", required=True, type=Path, help="select's train/ task set")
    p.add_argument("--held-out", required=True, type=Path, help="select's test/ task set")
    add_out(p, "train/, test/, family.json, report.md", path=True)
    p.add_argument("--family", choices=[str(f) for f in Family], default="auto")
    p.add_argument("--n-train", type=int, default=64)
    p.add_argument("--n-held-out", type=int, default=40)
    p.add_argument(
        "--kinds",
        nargs="+",
        default=[],
        help="narrow the family: instruction constraint kinds, procedural datasets, search question kinds",
    )
    p.add_argument(
        "--min-words",
        type=int,
        default=12,
        help="instruction: whole one-sentence replies of at least this many words holding a word of the request "
        "(0: plain requests)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from components.task_family.stage import run_task_family

    choice = run_task_family(
        args.selected,
        args.held_out,
        args.out,
        family=Family(args.family),
        n_train=args.n_train,
        n_held_out=args.n_held_out,
        kinds=tuple(args.kinds),
        min_words=args.min_words,
        seed=args.seed,
    )
    print(json.dumps({**asdict(choice), "family": str(choice.family)}))
    return 0
