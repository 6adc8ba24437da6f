"""`harnessrl stage build-environments` on a local task set."""

from __future__ import annotations

import argparse
import json

from components.flags import add_out, add_tasks


def register(commands, stages) -> None:
    from components.build_environments.stage import ImagePolicy

    s = stages.add_parser(
        "build-environments",
        help="build each repo's environment image (podman) and record image_name per task",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_tasks(s, help="input task-set directory", path=True)
    add_out(s, "tasks/, images.jsonl, report.md, metrics.json", path=True)
    s.add_argument(
        "--policy",
        choices=list(ImagePolicy),
        default=ImagePolicy.AUTO,
        help="auto: a row's own image when present locally; build: always build; keep: rows' own images as is",
    )
    s.set_defaults(func=_build)


def _build(args) -> int:
    from components.build_environments.stage import ImagePolicy, run_build_environments
    from harnessrl.cli import UserError
    from harnessrl.sandbox.images import ImageError

    try:
        metrics = run_build_environments(args.tasks, args.out, ImagePolicy(args.policy))
    except (ImageError, RuntimeError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    print(json.dumps(metrics))
    return 0
