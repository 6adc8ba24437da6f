"""The `harnessrl-full` extension point: stages wired by name, rounds chained through the checkpoint.

The stage components here are small real KFP components standing in for stages whose owners have not
landed them; the real slots load `components/<stage>/component.py` the same way.
"""

import pytest
from kfp import compiler
from kfp.dsl import Dataset, Input, Model, Output

from components.common import component
from pipelines.full import STAGE_SLOTS, PipelineUnavailable, StageSlot, build_full_pipeline
from pipelines.spec_checks import CompiledPipeline, gpu_problems, secret_env_problems


@component
def estimate_difficulty(tasks: Input[Dataset], policy: Input[Model], estimates: Output[Dataset]):
    open(estimates.path, "w").write("estimates\n")


@component
def select(tasks: Input[Dataset], estimates: Input[Dataset], selected: Output[Dataset]):
    import shutil

    shutil.copytree(tasks.path, selected.path)


@component
def generate_rollouts(
    tasks: Input[Dataset],
    policy: Input[Model],
    rollouts: Output[Dataset],
    samples: Output[Dataset],
    n_samples: int = 2,
):
    text = open(policy.path + "/weights.txt").read() if not policy.path.endswith(".txt") else "base"
    open(rollouts.path, "w").write(f"rollouts of {text.strip()}\n")
    open(samples.path, "w").write(f"samples x{n_samples}\n")


@component
def verify(tasks: Input[Dataset], rollouts: Input[Dataset], verified: Output[Dataset]):
    open(verified.path, "w").write(open(rollouts.path).read())


@component
def train_grpo(
    samples: Input[Dataset],
    verified: Input[Dataset],
    policy: Input[Model],
    model: Output[Model],
    seed: int = 0,
):
    import os

    os.makedirs(model.path)
    used = open(verified.path).read().strip()
    open(os.path.join(model.path, "weights.txt"), "w").write(f"trained on [{used}]\n")


def slots():
    impl = {
        "estimate_difficulty": estimate_difficulty,
        "select": select,
        "generate_rollouts": generate_rollouts,
        "verify": verify,
        "train_grpo": train_grpo,
    }
    return [
        StageSlot(s.stage, impl[s.stage], s.per_round, s.gpus, s.streams_large_objects, s.aliases)
        for s in STAGE_SLOTS
    ]


def test_missing_stage_is_named():
    broken = [StageSlot("select", "components.nonexistent.component:select")]
    with pytest.raises(PipelineUnavailable, match="select: module components.nonexistent"):
        build_full_pipeline(broken)

    @component
    def needs_unknown(mystery: Input[Dataset]):
        pass

    with pytest.raises(PipelineUnavailable, match=r"input\(s\) \['mystery'\] have no upstream"):
        build_full_pipeline([StageSlot("odd", needs_unknown)])


def test_full_pipeline_compiles_with_rounds_chained_and_gpu_placement(tmp_path):
    path = tmp_path / "full.yaml"
    compiler.Compiler().compile(build_full_pipeline(slots(), rounds=2), str(path))
    pipeline = CompiledPipeline.load(path)
    dag = pipeline.spec["root"]["dag"]["tasks"]
    by_display = {t["taskInfo"]["name"]: name for name, t in dag.items()}
    for stage in (
        "estimate-difficulty",
        "select",
        "generate-rollouts-round-1",
        "verify-round-1",
        "train-grpo-round-1",
        "generate-rollouts-round-2",
        "verify-round-2",
        "train-grpo-round-2",
    ):
        assert stage in by_display, sorted(by_display)

    def source(display, artifact):
        return dag[by_display[display]]["inputs"]["artifacts"][artifact]

    # round 2 samples from round 1's trained policy; round 1 from the imported base model
    assert source("generate-rollouts-round-2", "policy")["taskOutputArtifact"] == {
        "producerTask": by_display["train-grpo-round-1"],
        "outputArtifactKey": "model",
    }
    assert (
        source("generate-rollouts-round-1", "policy")["taskOutputArtifact"]["producerTask"]
        == by_display["import-base-model"]
    )
    assert source("generate-rollouts-round-1", "tasks")["taskOutputArtifact"] == {
        "producerTask": by_display["select"],
        "outputArtifactKey": "selected",
    }
    assert source("estimate-difficulty", "tasks")["taskOutputArtifact"] == {
        "producerTask": by_display["clean"],
        "outputArtifactKey": "kept",
    }
    assert "validate" in dag[by_display["estimate-difficulty"]]["dependentTasks"]
    for display in ("generate-rollouts-round-1", "train-grpo-round-2", "estimate-difficulty"):
        label = pipeline.spec["components"][dag[by_display[display]]["componentRef"]["name"]]["executorLabel"]
        assert gpu_problems(pipeline, label, gpus=1) == [], display
    for display in ("generate-rollouts-round-2", "train-grpo-round-1"):
        label = pipeline.spec["components"][dag[by_display[display]]["componentRef"]["name"]]["executorLabel"]
        assert secret_env_problems(pipeline, label) == [], display
    verify_label = pipeline.spec["components"][dag[by_display["verify-round-1"]]["componentRef"]["name"]][
        "executorLabel"
    ]
    assert gpu_problems(pipeline, verify_label)  # CPU stage: no GPU placement


def test_rounds_must_be_positive():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        build_full_pipeline(slots(), rounds=0)
