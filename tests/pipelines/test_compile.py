"""Every registered pipeline compiles, kfp loads it back, and cluster placement is what the stages need."""

import os
from typing import Any, cast

import pytest
import yaml
from kfp import components, dsl

from components.validate.component import validate
from harnessrl.cli import main
from pipelines.compile import compile_all, compile_to_file
from pipelines.k8s import gpu_step, use_s3_credentials
from pipelines.registry import PIPELINES
from pipelines.spec_checks import (
    CompiledPipeline,
    gpu_problems,
    literal_env_names,
    placement_problems,
    secret_env_problems,
)

# What the cluster needs, stated independently of pipelines/full.py: GPUs per step (a number, or the pipeline
# parameter that sets it when the run starts), and the steps that stream big objects to the store (S3
# credentials from the Secret).
GPU_STAGES: dict[str, int | str] = {
    "estimate-difficulty": 1,
    "generate-rollouts": 1,
    "train-grpo": 1,
    "rl-loop": "rl_gpus",
    "evaluate": 1,
    "sft": 1,
}
S3_STAGES = {"generate-rollouts", "train-grpo", "rl-loop"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled")
    sentinel = "SENTINEL-secret-value-must-not-leak"
    old = os.environ.get("AWS_SECRET_ACCESS_KEY")
    os.environ["AWS_SECRET_ACCESS_KEY"] = sentinel
    try:
        result = compile_all(out)
    finally:
        if old is None:
            os.environ.pop("AWS_SECRET_ACCESS_KEY")
        else:
            os.environ["AWS_SECRET_ACCESS_KEY"] = old
    return result, sentinel


def test_every_pipeline_compiles(compiled):
    written, _ = compiled
    assert set(written) == set(PIPELINES)
    assert all(path.is_file() and path.stat().st_size > 0 for path in written.values())


def test_compiled_yaml_loads_back_in_kfp(compiled):
    written, sentinel = compiled
    for name, path in written.items():
        comp = components.load_component_from_file(str(path))
        assert comp.name == name
        text = path.read_text()
        assert sentinel not in text, f"{name}: a credential value leaked into the compiled YAML"
        pipeline = CompiledPipeline.load(path)
        assert pipeline.name == name
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & literal_env_names(pipeline)
        images = {
            pipeline.executor(label)["container"]["image"]
            for _, _, label in pipeline.tasks()
            if "container" in pipeline.executor(label)
        }
        assert len(images) == 1, f"{name}: every step should use the project image, got {images}"


def test_per_stage_pipelines_import_by_uri(compiled):
    written, _ = compiled
    for name, param in (
        ("clean-only", "tasks_uri"),
        ("validate-only", "tasks_uri"),
        ("data-prep", "source_uri"),
    ):
        spec = yaml.safe_load(written[name].read_text())
        assert spec["root"]["inputDefinitions"]["parameters"][param]["parameterType"] == "STRING"
        importers = [e for e in spec["deploymentSpec"]["executors"].values() if "importer" in e]
        assert importers and all(
            e["importer"]["artifactUri"] == {"runtimeParameter": "uri"} for e in importers
        ), name


def test_data_prep_wiring(compiled):
    written, _ = compiled
    pipeline = CompiledPipeline.load(written["data-prep"])
    dag = pipeline.spec["root"]["dag"]["tasks"]
    assert dag["clean"]["inputs"]["artifacts"]["tasks"]["taskOutputArtifact"] == {
        "producerTask": "synthesize",
        "outputArtifactKey": "tasks",
    }
    assert dag["validate"]["inputs"]["artifacts"]["tasks"]["taskOutputArtifact"] == {
        "producerTask": "clean",
        "outputArtifactKey": "kept",
    }
    outputs = pipeline.spec["components"]["comp-clean"]["outputDefinitions"]["artifacts"]
    assert outputs["report"]["artifactType"]["schemaTitle"] == "system.Markdown"
    assert outputs["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"


def test_gpu_stages_in_compiled_pipelines_are_placed_on_gpus(compiled):
    """Checks GPU stages automatically once their components exist and the full pipeline compiles."""
    written, _ = compiled
    checked = 0
    for path in written.values():
        pipeline = CompiledPipeline.load(path)
        for task_path, comp_name, label in pipeline.tasks():
            stage = (
                comp_name.removeprefix("comp-").rsplit("-", 1)[0]
                if comp_name[-1].isdigit()
                else comp_name.removeprefix("comp-")
            )
            if stage in GPU_STAGES:
                assert gpu_problems(pipeline, label, gpus=GPU_STAGES[stage]) == [], task_path
                checked += 1
            if stage in S3_STAGES:
                assert secret_env_problems(pipeline, label) == [], task_path
    # harnessrl-full: difficulty, the rl loop, evaluate; harnessrl-full-cold-start: the same and sft;
    # harnessrl-rounds: difficulty, then generate and train in each of its 2 rounds
    assert checked == 3 + 4 + 5


def test_gpu_step_helper_and_checker(tmp_path):
    @dsl.pipeline(name="gpu-check")
    def gpu_check(tasks_uri: str):
        imported = dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset)
        on_gpu = validate(tasks=imported.output).set_display_name("on-gpu")
        with pytest.raises(ValueError, match="gpus must be >= 1"):
            gpu_step(on_gpu, gpus=0)
        gpu_step(on_gpu, gpus=4, accelerator="nvidia.com/gpu", cpu="16", memory="128G")
        use_s3_credentials(on_gpu)
        validate(tasks=imported.output).set_display_name("on-cpu")

    path = compile_to_file(gpu_check, tmp_path / "gpu.yaml")
    pipeline = CompiledPipeline.load(path)
    (gpu_task,) = pipeline.gpu_tasks()
    label = gpu_task[2]
    assert gpu_problems(pipeline, label, gpus=4) == []
    assert gpu_problems(pipeline, label, gpus=2) == [f"{label}: accelerator count 4, expected 2"]
    assert gpu_problems(pipeline, label, gpus="gpus") == [f"{label}: accelerator count 4, expected gpus"]
    res = pipeline.resources(label)
    assert (res["resourceCpuLimit"], res["resourceMemoryLimit"]) == ("16", "128G")
    assert pipeline.platform[label]["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert pipeline.platform[label]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert secret_env_problems(pipeline, label) == []
    (cpu_label,) = [
        lbl for _, _, lbl in pipeline.tasks() if lbl != label and "container" in pipeline.executor(lbl)
    ]
    problems = gpu_problems(pipeline, cpu_label)
    assert any("accelerator type None" in p for p in problems) and any("node selector" in p for p in problems)
    assert secret_env_problems(pipeline, cpu_label)
    assert placement_problems(pipeline) == []
    (problem,) = placement_problems(pipeline, s3_components={"validate"})  # the CPU copy has no Secret env
    assert "not taken from a Secret" in problem


def test_a_pipeline_used_as_a_step_cannot_be_placed_on_gpus():
    """kfp's own check, kept by pipelines.k8s without its inspect.stack(): the setting is named."""

    @dsl.pipeline(name="inner")
    def inner(tasks_uri: str):
        validate(tasks=dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset).output)

    @dsl.pipeline(name="outer")
    def outer(tasks_uri: str):
        with pytest.raises(
            ValueError, match="set_accelerator_type can only be used on single-step components"
        ):
            gpu_step(cast(dsl.PipelineTask, inner(tasks_uri=tasks_uri)))  # a pipeline's call is a task


def test_kfp_local_runs_a_step_whose_gpu_count_is_a_parameter(tmp_path):
    """kfp.local takes the task inputs the compiler adds for a runtime accelerator count (it places nothing)."""
    from kfp import local

    @dsl.component
    def ranks_seen(nproc: int) -> int:
        return nproc

    seen: Any = ranks_seen  # a component called with a pipeline parameter (pyright reads the Python types)

    @dsl.pipeline(name="gpus-per-run")
    def gpus_per_run(gpus: int = 1) -> int:
        task = seen(nproc=gpus)
        gpu_step(task, gpus=gpus)
        return task.output

    path = compile_to_file(gpus_per_run, tmp_path / "gpus.yaml")
    (task,) = CompiledPipeline.load(path).gpu_tasks()
    assert CompiledPipeline.load(path).accelerator_count(task[2]) == "gpus"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    run: Any = gpus_per_run
    assert run(gpus=3).output == 3


def test_compile_cli(tmp_path, capsys):
    assert main(["compile", "--out", str(tmp_path / "out"), "--pipeline", "clean-only"]) == 0
    assert (tmp_path / "out" / "clean-only.yaml").is_file()
    assert "compiled clean-only" in capsys.readouterr().out
    assert main(["compile", "--out", str(tmp_path / "out"), "--pipeline", "data-prep", "--check"]) == 0
    assert "placement checked: 1 pipeline(s) ok" in capsys.readouterr().out
    assert main(["compile", "--out", str(tmp_path / "out"), "--pipeline", "nope"]) == 2
    assert "unknown pipeline 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "gpu_tasks"), [("harnessrl-full", 3), ("harnessrl-full-cold-start", 4), ("harnessrl-rounds", 5)]
)
def test_training_pipelines_are_placed_for_the_cluster(tmp_path, name, gpu_tasks):
    from kfp import compiler

    compiler.Compiler().compile(PIPELINES[name].load(), str(tmp_path / f"{name}.yaml"))
    compiled = CompiledPipeline.load(tmp_path / f"{name}.yaml")
    assert len(compiled.gpu_tasks()) == gpu_tasks
    assert placement_problems(compiled, S3_STAGES) == []
