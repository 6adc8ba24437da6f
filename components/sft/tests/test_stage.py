"""`harnessrl stage sft` end to end on a synthesized task set (demonstrations through the real harness,
gateway, sandbox and verify; SFT with the train stage's machinery), then rejection sampling from that run."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from harnessrl.cli import main
from tests.support.fixtures import requires_bwrap


def test_component_compiles_with_typed_artifacts(tmp_path):
    import yaml
    from kfp import compiler

    from components.sft.component import sft

    out = tmp_path / "sft.yaml"
    compiler.Compiler().compile(sft, str(out))
    comp = yaml.safe_load(out.read_text())["components"]["comp-sft"]
    arts_in = {k: v["artifactType"]["schemaTitle"] for k, v in comp["inputDefinitions"]["artifacts"].items()}
    arts_out = {
        k: v["artifactType"]["schemaTitle"] for k, v in comp["outputDefinitions"]["artifacts"].items()
    }
    assert arts_in == {
        "tasks": "system.Dataset",
        "policy": "system.Model",
        "rollouts": "system.Dataset",
        "verified": "system.Dataset",
    }
    assert arts_out == {
        "model": "system.Model",
        "metrics": "system.Metrics",
        "report": "system.Markdown",
        "report_html": "system.HTML",
    }
    assert comp["inputDefinitions"]["artifacts"]["rollouts"].get("isOptional") is True


def test_rejection_without_a_run_is_a_clear_error(tmp_path, synth_taskset, capsys):
    rc = main(
        ["stage", "sft", "--tasks", str(synth_taskset), "--out", str(tmp_path / "o"), "--source", "rejection"]
    )
    assert rc == 2
    assert "--rollouts and --verified" in capsys.readouterr().err


@requires_bwrap
@pytest.mark.slow
def test_stage_sft_end_to_end(tmp_path, synth_taskset, tiny_policy_dir, tokenizer, capsys):
    out = tmp_path / "sft"
    common = ["--policy", str(tiny_policy_dir), "--lr", "3e-3", "--groups-per-step", "0", "--device", "cpu"]
    rc = main(
        [
            "stage",
            "sft",
            "--tasks",
            str(synth_taskset),
            "--out",
            str(out),
            "--max-tasks",
            "2",
            "--epochs",
            "3",
            *common,
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["steps"] == 3 and printed["tasks"] == 2 and printed["samples"] == 2
    assert printed["loss"] < printed["loss_first"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sources"]["demonstrations"]["resolved"] == 2
    assert (out / "model" / "config.json").is_file() and (out / "model" / "model.safetensors").is_file()
    report = (out / "report.md").read_text()
    assert report.startswith("# SFT stage (cold start)") and "data:image/png;base64," in report
    trained = pq.read_table(out / "data" / "samples.parquet").to_pylist()
    assert {r["rollout_id"].split("/")[0] for r in trained} == {"demo"}

    # rejection sampling: the demonstrations' run read as "an earlier run" (no new rollouts)
    out2 = tmp_path / "rs"
    rc = main(
        [
            "stage",
            "sft",
            "--tasks",
            str(synth_taskset),
            "--out",
            str(out2),
            "--source",
            "rejection",
            "--rollouts",
            str(out / "demos" / "rollouts"),
            "--verified",
            str(out / "demos" / "verified"),
            "--epochs",
            "1",
            *common,
        ]
    )
    assert rc == 0
    metrics2 = json.loads((out2 / "metrics.json").read_text())
    assert metrics2["sources"] == {"rejection": {"rollouts": 2, "resolved": 2, "samples": 2, "tasks": 2}}
    assert not (out2 / "demos").exists() and metrics2["steps"] == 1
