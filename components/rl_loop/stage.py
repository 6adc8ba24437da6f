"""The `rl_loop` stage, as the CLI (`harnessrl stage rl`) and the KFP component both run it: settings from a
JSON document with the caller's overrides laid over it, then the loop in this process — or, with `nproc` > 1
(or `nnodes` > 1) outside torchrun, under torchrun with that many trainer ranks on this node
(harnessrl.rl.ranks.launch; rank 0 prints the step lines, this process its summary once every rank ended)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.rl.config import RLConfig, RLInputs
from harnessrl.rl.records import RLSummary


def build_config(
    config: dict[str, Any], overrides: dict[str, Any], lr: float | None = None, lora_rank: int | None = None
) -> RLConfig:
    """`config` (the `--config` file or `config_json`) with `overrides` (top-level fields; None: not given),
    the learning rate and the LoRA rank laid over it."""
    from harnessrl.rl.config import current_layout
    from harnessrl.train.lora import with_lora_rank

    base = with_lora_rank(current_layout(config), lora_rank)
    base.update({k: v for k, v in overrides.items() if v is not None})
    if lr is not None:
        train = dict(base.get("train") or {})
        train["optim"] = {**dict(train.get("optim") or {}), "lr": lr}
        base["train"] = train
    return RLConfig.from_dict(base)


def launched(cfg: RLConfig) -> bool:
    """Whether `run_stage` starts torchrun (rather than being a rank of it, or running alone)."""
    from harnessrl.rl.ranks import in_torchrun

    return cfg.trainer_ranks > 1 and not in_torchrun()


def run_stage(cfg: RLConfig, inputs: RLInputs, echo: Callable[[str], None] | None = None) -> RLSummary | None:
    """The loop, here or under torchrun; None on a trainer rank other than 0."""
    from harnessrl.rl.loop import run_rl
    from harnessrl.rl.ranks import launch

    if launched(cfg):
        if inputs.specs is not None and not isinstance(inputs.specs, str | Path):  # the ranks read a file
            inputs.out.mkdir(parents=True, exist_ok=True)
            path = inputs.out / "specs.json"
            path.write_text(json.dumps([s.to_row() for s in inputs.specs]))
            inputs.specs = path
        return launch(cfg, inputs)
    return run_rl(cfg, inputs, echo)
