"""`harnessrl` command line. Each area registers its own commands (see COMMAND_MODULES).

Logging is configured here, once, from the global flags before the command (`harnessrl -v run ...`):
-q warnings only and no progress bars, -v debug output, -vv debug output from other libraries too,
--no-progress no progress bars. Both choices are exported (HARNESSRL_LOG_LEVEL, HARNESSRL_PROGRESS) for the
duration of the command, so the processes it starts (pipeline steps, torchrun ranks) follow them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping

from harnessrl.logs import LOG_LEVEL_ENV, configure_logging
from harnessrl.progress import PROGRESS_ENV

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
    "components.build_environments.cli",
    "components.train.cli",
    "components.evaluate.cli",
    "components.sft.cli",
    "components.rl_loop.cli",
    "components.task_family.cli",
)

# Top-level modules of the [local] extra (torch, ...): an install without it (the cpu project image) has no
# commands of the areas that import them, instead of no CLI at all.
LOCAL_EXTRA_MODULES = frozenset(
    {"torch", "transformers", "gguf", "accelerate", "safetensors", "ray", "aiohttp", "orjson", "uvloop"}
)
logger = logging.getLogger(__name__)


class UserError(Exception):
    """A problem with the user's input: printed as one clear line, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harnessrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="debug output (-vv: also from the libraries harnessrl uses; `run`: every step's log live)",
    )
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    stage = commands.add_parser("stage", help="run one pipeline stage alone on given input files")
    stages = stage.add_subparsers(dest="stage", metavar="STAGE")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that area is not part of this build
                continue
            if (e.name or "").split(".")[0] in LOCAL_EXTRA_MODULES:  # e.g. the cpu image: no torch
                logger.debug("`harnessrl` without %s's commands: %s is not installed", name, e.name)
                continue
            raise
        module.register(commands, stages)
    return parser


@contextlib.contextmanager
def _exported(env: Mapping[str, str]) -> Iterator[None]:
    """Sets environment variables for the duration of one command (main() also runs in-process in tests)."""
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else None
        level = configure_logging(level, others=logging.DEBUG if args.verbose >= 2 else logging.WARNING)
        env = {LOG_LEVEL_ENV: logging.getLevelName(level)}
        if args.quiet or args.no_progress:
            env[PROGRESS_ENV] = "0"
        with _exported(env):
            code = int(func(args) or 0)
            sys.stdout.flush()  # here, so that a closed pipe is caught below and not at interpreter exit
            return code
    except (UserError, FileNotFoundError, ValueError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"harnessrl: error: {msg}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`harnessrl ... | head`): no traceback, as other CLIs
        # Python flushes stdout again at exit, which would raise once more into the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


if __name__ == "__main__":
    # Re-enter through the imported module so areas raising harnessrl.cli.UserError are caught by the same class.
    from harnessrl.cli import main as _main

    sys.exit(_main())
