"""The flags several `harnessrl stage <name>` commands share, declared once, and `config_with_flags`, which lays
the flags given over a stage's `--config` JSON. Imported at CLI start-up: no kfp, no torch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harnessrl.rollout.config import DEFAULT_CONCURRENCY


def add_tasks(
    parser: argparse.ArgumentParser, help: str, required: bool = True, path: bool = False
) -> argparse.Action:
    """Declares `--tasks`, the input task set; `path`: parsed as a Path (else left a str)."""
    return parser.add_argument("--tasks", required=required, type=Path if path else str, help=help)


def add_out(
    parser: argparse.ArgumentParser, contents: str, required: bool = True, path: bool = False
) -> argparse.Action:
    """Declares `--out`, the stage's output directory, described as "output directory (<contents>)";
    `path`: parsed as a Path (else left a str)."""
    return parser.add_argument(
        "--out", required=required, type=Path if path else str, help=f"output directory ({contents})"
    )


def add_specs(parser: argparse.ArgumentParser, help: str) -> argparse.Action:
    """Declares `--specs`, an optional harness spec JSON file."""
    return parser.add_argument("--specs", help=help)


def add_concurrency(
    parser: argparse.ArgumentParser,
    default: int | None = DEFAULT_CONCURRENCY,
    help: str = "rollouts in flight at once",
) -> argparse.Action:
    """Declares `--concurrency`, the number of rollouts in flight at once (an int)."""
    return parser.add_argument("--concurrency", type=int, default=default, help=help)


def add_policy(
    parser: argparse.ArgumentParser,
    help: str = "HF model directory to start from (default: the tiny embedded model)",
) -> argparse.Action:
    """Declares `--policy`, the optional model to start from (None: the tiny embedded model)."""
    return parser.add_argument("--policy", help=help)


def add_config(parser: argparse.ArgumentParser, fields: str) -> argparse.Action:
    """Declares `--config`, an optional JSON file of `fields` (e.g. "TrainConfig") that the stage's other flags
    override (see config_with_flags)."""
    return parser.add_argument("--config", help=f"JSON file with {fields} fields (flags below override it)")


def add_model_out(parser: argparse.ArgumentParser) -> argparse.Action:
    """Declares `--model-out`, where the final model is written (None: OUT/model)."""
    return parser.add_argument("--model-out", help="where to write the final model (default: OUT/model)")


def config_with_flags(args: argparse.Namespace, top: tuple[str, ...], train: tuple[str, ...]) -> dict:
    """The `--config` JSON with the flags that were given laid over it: `top` flags as top-level keys,
    `train` flags under "train", and `--lr` as train.optim.lr (the train and sft stages share this shape)."""
    base: dict = {}
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            base = json.load(f)
    step = dict(base.get("train", {}))
    optim = dict(step.get("optim", {}))
    for flag in top:
        if getattr(args, flag) is not None:
            base[flag] = getattr(args, flag)
    for flag in train:
        if getattr(args, flag) is not None:
            step[flag] = getattr(args, flag)
    if args.lr is not None:
        optim["lr"] = args.lr
    step["optim"] = optim
    base["train"] = step
    return base
