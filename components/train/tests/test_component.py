"""The `train_grpo` KFP component: typed artifacts in the compiled spec, and a real kfp.local run."""

import json

import pytest

from tests.train.support import write_round


def test_component_compiles_with_typed_artifacts(tmp_path):
    from kfp import compiler

    from components.train.component import train_grpo

    out = tmp_path / "train.yaml"
    compiler.Compiler().compile(train_grpo, str(out))
    import yaml

    spec = yaml.safe_load(out.read_text())
    comp = spec["components"]["comp-train-grpo"]
    arts_in = {k: v["artifactType"]["schemaTitle"] for k, v in comp["inputDefinitions"]["artifacts"].items()}
    arts_out = {
        k: v["artifactType"]["schemaTitle"] for k, v in comp["outputDefinitions"]["artifacts"].items()
    }
    assert arts_in == {"samples": "system.Dataset", "verified": "system.Dataset", "policy": "system.Model"}
    assert arts_out == {
        "model": "system.Model",
        "metrics": "system.Metrics",
        "report": "system.Markdown",
        "report_html": "system.HTML",
    }


@pytest.mark.slow
def test_component_runs_under_kfp_local(tmp_path, tokenizer, tiny_policy_dir):
    """The real KFP component in kfp.local (SubprocessRunner, this env): typed artifacts in and out."""
    from kfp import dsl, local

    from components.train.component import train_grpo

    data = tmp_path / "data"
    (data / "samples").mkdir(parents=True)
    (data / "verified").mkdir()
    sp, rp, _ = write_round(tmp_path, tokenizer, groups=2, per_group=3, failed=0)
    sp.rename(data / "samples" / "samples.parquet")
    rp.rename(data / "verified" / "rewards.jsonl")

    @dsl.pipeline(name="train-only")
    def train_only(samples_uri: str, verified_uri: str, policy_uri: str):
        samples = dsl.importer(artifact_uri=samples_uri, artifact_class=dsl.Dataset)
        verified = dsl.importer(artifact_uri=verified_uri, artifact_class=dsl.Dataset)
        policy = dsl.importer(artifact_uri=policy_uri, artifact_class=dsl.Model)
        train_grpo(
            samples=samples.output,
            verified=verified.output,
            policy=policy.output,
            config_json=json.dumps({"groups_per_step": 1}),
            seed=1,
        )

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        raise_on_error=True,
    )
    train_only(
        samples_uri=str(data / "samples"),
        verified_uri=str(data / "verified"),
        policy_uri=str(tiny_policy_dir),
    )
    models = list((tmp_path / "root").rglob("model/config.json"))
    reports = [p for p in (tmp_path / "root").rglob("report") if p.is_file()]
    assert len(models) == 1 and len(reports) == 1
    assert "# GRPO train stage" in reports[0].read_text()
    executor = json.loads((models[0].parent.parent / "executor_output.json").read_text())
    logged = executor["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert logged["steps"] == 2 and logged["groups_trained"] == 2 and logged["padding_fraction"] == 0
