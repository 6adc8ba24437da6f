"""`harnessrl stage evaluate`: pass@1 / pass@k of one or more policies on a task set (by default the held-out
split of a `select` output), through the same generate -> verify path as training; and
`harnessrl stage evaluate --compare A.json B.json`: the difference of two saved evaluations, with its interval
and whether it is significant."""

from __future__ import annotations

import argparse
import json
import sys

from components.flags import add_concurrency, add_out, add_specs, add_tasks
from harnessrl.difficulty.selection import Split
from harnessrl.evaluate.results import EvalMode

BASE = "base"  # `--policy NAME=base`: the tiny embedded base model


def register(commands, stages) -> None:
    p = stages.add_parser(
        "evaluate",
        help="pass@1/pass@k with intervals per policy on held-out tasks; --compare A.json B.json",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two evaluation.json files: B - A")
    p.add_argument("--a-policy", help="--compare: the policy of A (default: A's last)")
    p.add_argument("--b-policy", help="--compare: the policy of B (default: B's last)")
    p.add_argument("--json", action="store_true", help="--compare: print the comparison as JSON")
    add_tasks(
        p,
        help="task-set directory, or a `select` output directory (then its --split is used)",
        required=False,
    )
    p.add_argument(
        "--split", type=Split, choices=list(Split), default=Split.TEST, help="split of a select output"
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME=SOURCE",
        help="repeatable; SOURCE: a checkpoint directory, 'base' (the tiny embedded model), or the URL of an "
        "engine serving that policy (its tokenizer: --tokenizer). The first policy is the baseline every other "
        "one is compared with. Default: base=base",
    )
    p.add_argument(
        "--tokenizer", help="checkpoint directory whose tokenizer URL policies use (default: tiny)"
    )
    p.add_argument("--k", type=int, default=4, help="rollouts per task in sampled mode")
    p.add_argument(
        "--mode",
        type=EvalMode,
        choices=list(EvalMode),
        action="append",
        help="repeatable: greedy (temperature 0, 1 rollout per task) and/or sampled (k per task); "
        "default: sampled",
    )
    add_specs(p, help="harness spec JSON file (as for `harnessrl stage generate`)")
    add_out(p, "replaced atomically", required=False)
    add_concurrency(p)
    p.add_argument("--verify-workers", type=int, default=2)
    p.add_argument("--max-tasks", type=int, help="only the first N tasks")
    p.add_argument("--instance-ids", nargs="+", help="only these tasks")
    p.add_argument("--bootstrap", type=int, default=10_000, help="bootstrap resamples for differences")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    p.add_argument("--max-batch", type=int, default=16, help="local engine: requests decoded together")
    p.add_argument(
        "--allow-unsandboxed", action="store_true", help="permit specs with sandbox 'local' (debugging only)"
    )
    p.set_defaults(func=_run)


def parse_policy(text: str, tokenizer: str | None):
    from components.evaluate.stage import Policy

    name, sep, source = text.partition("=")
    if not sep or not name or not source:
        raise ValueError(
            f"--policy {text!r}: expected NAME=SOURCE (a checkpoint dir, 'base' or an engine URL)"
        )
    if source == BASE:
        return Policy(name)
    if source.startswith(("http://", "https://")):
        return Policy(name, checkpoint=tokenizer, engine_url=source)
    from pathlib import Path

    if not Path(source).is_dir():
        raise ValueError(f"--policy {text!r}: {source} is not a checkpoint directory")
    return Policy(name, checkpoint=source)


def _run(args) -> int:
    if args.compare:
        return _compare(args)
    from harnessrl.cli import UserError

    if not args.tasks or not args.out:
        raise UserError("stage evaluate: give --tasks and --out (or --compare A.json B.json)")
    from components.evaluate.stage import EvaluateConfig, resolve_tasks, run_evaluate

    policies = [parse_policy(p, args.tokenizer) for p in args.policy or [f"{BASE}={BASE}"]]
    config = EvaluateConfig(
        k=args.k,
        modes=tuple(args.mode or [EvalMode.SAMPLED]),
        concurrency=args.concurrency,
        verify_workers=args.verify_workers,
        seed=args.seed,
        max_tasks=args.max_tasks,
        instance_ids=args.instance_ids,
        bootstrap_iterations=args.bootstrap,
        allow_unsandboxed=args.allow_unsandboxed,
        max_batch=args.max_batch,
    )
    evaluation = run_evaluate(resolve_tasks(args.tasks, args.split), args.out, policies, args.specs, config)
    from harnessrl.evaluate.results import describe

    summary = {
        f"{r['policy']}/{r['mode']}": {
            "pass_at_1": r["pass_at_1"],
            "ci": r["pass_at_1_ci"],
            "graded": r["graded"],
        }
        for r in evaluation["results"]
    }
    print(json.dumps(summary))
    for c in evaluation["comparisons"]:
        print(describe(c), file=sys.stderr)
    print(f"wrote {args.out}/evaluation.json, report.md, pass_at_1.png", file=sys.stderr)
    return 0


def _compare(args) -> int:
    from harnessrl.evaluate.results import compare, describe, load_evaluation, pick_result

    path_a, path_b = args.compare
    mode = args.mode[0] if args.mode else None
    a = pick_result(load_evaluation(path_a), path_a, args.a_policy, mode)
    b = pick_result(load_evaluation(path_b), path_b, args.b_policy, mode or a["mode"])
    if a["policy"] == b["policy"]:  # e.g. "final" of two runs: name them by their files
        a, b = {**a, "policy": f"{a['policy']}@{path_a}"}, {**b, "policy": f"{b['policy']}@{path_b}"}
    if a["mode"] != b["mode"]:
        raise ValueError(f"{path_a} is {a['mode']} and {path_b} is {b['mode']}; pick one with --mode")
    result = compare(a, b, iterations=args.bootstrap, seed=args.seed)
    print(json.dumps(result, sort_keys=True) if args.json else describe(result))
    return 0
