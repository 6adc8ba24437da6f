"""`harnessrl` command line. Each area registers its own commands (see COMMAND_MODULES)."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module defines `register(commands, stages)`: `commands` is the top-level subparsers object,
# `stages` the subparsers of `harnessrl stage <name>`. A handler is set with parser.set_defaults(func=...)
# and returns an int exit code.
COMMAND_MODULES = (
    "dataprep.cli",
    "pipelines.cli",
    "harnessrl.sandbox.cli",
    "harnessrl.engine.cli",
    "harnessrl.gateway.cli",
    "components.generate.cli",
    "components.verify.cli",
    "components.estimate_difficulty.cli",
    "components.select_tasks.cli",
    "components.train.cli",
)


class UserError(Exception):
    """A problem with the user's input: printed as one clear line, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessrl", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    stage = commands.add_parser("stage", help="run one pipeline stage alone on given input files")
    stages = stage.add_subparsers(dest="stage", metavar="STAGE")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that area is not part of this build
                continue
            raise
        module.register(commands, stages)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except (UserError, FileNotFoundError, ValueError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"harnessrl: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Re-enter through the imported module so areas raising harnessrl.cli.UserError are caught by the same class.
    from harnessrl.cli import main as _main

    sys.exit(_main())
