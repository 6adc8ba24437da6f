"""The steps every training pipeline starts with after data prep: import the base model, estimate each task's
difficulty with Best-of-N rollouts of it (a GPU step, after validation passed), and select the training and
held-out splits. `harnessrl-full` and `harnessrl-rounds` both call `add_selection` and differ only after it."""

from dataclasses import dataclass

from kfp import dsl
from kfp.dsl.pipeline_channel import PipelineChannel

from components.estimate_difficulty.component import estimate_difficulty
from components.select_tasks.component import select
from pipelines.data_prep import DataPrepOutputs
from pipelines.k8s import gpu_step


@dataclass
class SelectionOutputs:
    base_model: PipelineChannel  # the imported base policy (a Model)
    estimate: dsl.PipelineTask  # estimate-difficulty (its `metrics` feed the run summary)
    selection: dsl.PipelineTask  # select: outputs `selected` (train), `held_out`, `metrics`


def add_selection(
    prep: DataPrepOutputs,
    base_model_uri: str,
    *,
    difficulty_n: int,
    rollout_concurrency: int,
    specs_json: str,
    engine_url: str,
    k_all_fail: int,
    test_fraction: float,
    seed: int,
) -> SelectionOutputs:
    base_model = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
    base_model.set_display_name("import-base-model")
    estimate = estimate_difficulty(
        tasks=prep.tasks,
        policy=base_model.output,
        n=difficulty_n,
        concurrency=rollout_concurrency,
        specs_json=specs_json,
        engine_url=engine_url,
    ).after(prep.gate)
    gpu_step(estimate, gpus=1)
    selection = select(
        tasks=prep.tasks,
        difficulty=estimate.outputs["estimates"],
        k_all_fail=k_all_fail,
        test_fraction=test_fraction,
        seed=seed,
    )
    return SelectionOutputs(base_model.output, estimate, selection)
