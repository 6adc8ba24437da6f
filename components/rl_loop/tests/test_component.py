"""The `rl_loop` component's interface (what pipelines wire) and the CLI's config building."""

import argparse

import pytest

from components.rl_loop.cli import build_config, register
from components.rl_loop.component import rl_loop
from harnessrl.rl.modes import RLMode


def test_component_interface():
    spec = rl_loop.component_spec
    assert spec.inputs is not None and spec.outputs is not None
    inputs = {name: str(i.type) for name, i in spec.inputs.items()}
    assert inputs["tasks"].startswith("system.Dataset") and inputs["policy"].startswith("system.Model")
    for name in ("mode", "steps", "batch_groups", "group_size", "max_staleness", "save_every", "engine_url"):
        assert name in inputs
    assert inputs["nproc"] == "Integer" and spec.inputs["nproc"].default == 1
    assert {"specs_json", "config_json", "seed"} <= set(inputs)
    outputs = {name: str(o.type) for name, o in spec.outputs.items()}
    assert outputs == {
        "model": "system.Model@0.0.1",
        "checkpoints": "system.Artifact@0.0.1",
        "metrics": "system.Metrics@0.0.1",
        "tensorboard": "system.Artifact@0.0.1",
        "report": "system.Markdown@0.0.1",
        "report_html": "system.HTML@0.0.1",
    }
    assert spec.inputs["mode"].default == "colocated"


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    stages = commands.add_parser("stage").add_subparsers()
    register(commands, stages)
    return parser.parse_args(["stage", "rl", "--tasks", "t", "--out", "o", *argv])


def test_cli_flags_override_the_config_file(tmp_path):
    config = tmp_path / "rl.json"
    config.write_text('{"mode": "sync", "steps": 3, "train": {"train": {"optim": {"lr": 1e-6}}}}')
    cfg = build_config(
        _parse(
            "--config", str(config), "--mode", "separate", "--lr", "3e-5", "--save-every", "2", "--nproc", "2"
        )
    )
    assert cfg.mode is RLMode.SEPARATE and cfg.steps == 3 and cfg.save_every == 2 and cfg.nproc == 2
    assert cfg.train.optim.lr == 3e-5  # the file's nested layout of earlier versions still reads


def test_bad_settings_name_the_field(tmp_path):
    config = tmp_path / "rl.json"
    config.write_text('{"mode": "fast"}')
    with pytest.raises(ValueError, match="mode must be one of sync, colocated, separate"):
        build_config(_parse("--config", str(config)))
    config.write_text('{"nproc": 0}')
    with pytest.raises(ValueError, match="nproc must be >= 1, got 0"):
        build_config(_parse("--config", str(config)))
    config.write_text('{"stepz": 3}')
    with pytest.raises(ValueError, match="stepz"):
        build_config(_parse("--config", str(config)))
