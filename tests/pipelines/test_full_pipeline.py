"""`harnessrl-full` and `harnessrl-rounds`: each compiled DAG has exactly the edges its module names at its call
sites (the RL loop trains from the base model; rounds chain through the trained model), GPU steps are placed,
and the full DAG (with the RL loop in colocated async mode) runs under kfp.local on the tiny real model."""

import json
from pathlib import Path

import pytest

from pipelines.compile import compile_to_file
from pipelines.full import harnessrl_full, harnessrl_full_cold_start
from pipelines.local_run import run_local
from pipelines.rounds import ROUNDS, harnessrl_rounds
from pipelines.spec_checks import CompiledPipeline, gpu_problems, secret_env_problems

REPO = Path(__file__).resolve().parents[2]
MINIREPO = REPO / "tests" / "fixtures" / "minirepo"


def _compile(pipeline_func, path: Path):
    compile_to_file(pipeline_func, path)
    pipeline = CompiledPipeline.load(path)
    dag = pipeline.spec["root"]["dag"]["tasks"]
    return pipeline, dag, {t["taskInfo"]["name"]: name for name, t in dag.items()}


@pytest.fixture(scope="module")
def compiled_full(tmp_path_factory):
    return _compile(harnessrl_full, tmp_path_factory.mktemp("full") / "full.yaml")


@pytest.fixture(scope="module")
def compiled_cold_start(tmp_path_factory):
    return _compile(harnessrl_full_cold_start, tmp_path_factory.mktemp("cold") / "cold.yaml")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile(harnessrl_rounds, tmp_path_factory.mktemp("rounds") / "rounds.yaml")


PREP_EDGES = [
    ("synthesize", "source", "import-source", "artifact"),
    ("clean", "tasks", "synthesize", "tasks"),
    ("validate", "tasks", "clean", "kept"),
    ("estimate-difficulty", "tasks", "clean", "kept"),
    ("estimate-difficulty", "policy", "import-base-model", "artifact"),
    ("select", "tasks", "clean", "kept"),
    ("select", "difficulty", "estimate-difficulty", "estimates"),
]
# (consumer step, its input) <- (producer step, its output): every artifact edge of the DAG, by display name.
FULL_EDGES = [
    *PREP_EDGES,
    ("task-family", "selected", "select", "selected"),
    ("task-family", "held_out", "select", "held_out"),
    ("rl-loop", "tasks", "task-family", "train"),
    ("rl-loop", "policy", "import-base-model", "artifact"),
    ("evaluate", "tasks", "task-family", "test"),
    ("evaluate", "base_policy", "import-base-model", "artifact"),
    ("evaluate", "policy", "rl-loop", "model"),
    ("summarize-run", "difficulty", "estimate-difficulty", "metrics"),
    ("summarize-run", "selection", "select", "metrics"),
    ("summarize-run", "family", "task-family", "metrics"),
    ("summarize-run", "trained", "rl-loop", "metrics"),
    ("summarize-run", "trained_steps", "rl-loop", "tensorboard"),
    ("summarize-run", "evaluated", "evaluate", "metrics"),
    ("summarize-run", "evaluation", "evaluate", "evaluation"),
]
# harnessrl-full-cold-start: the RL loop starts from the cold-start (SFT) model; evaluation compares to the base
COLD_START_EDGES = [
    *(e for e in FULL_EDGES if e[:2] != ("rl-loop", "policy")),
    ("cold-start", "tasks", "select", "selected"),
    ("cold-start", "policy", "import-base-model", "artifact"),
    ("rl-loop", "policy", "cold-start", "model"),
]
EDGES = [
    *PREP_EDGES,
    ("generate-rollouts-round-1", "tasks", "select", "selected"),
    ("generate-rollouts-round-1", "policy", "import-base-model", "artifact"),
    ("verify-round-1", "tasks", "select", "selected"),
    ("verify-round-1", "rollouts", "generate-rollouts-round-1", "rollouts"),
    ("train-grpo-round-1", "samples", "generate-rollouts-round-1", "samples"),
    ("train-grpo-round-1", "verified", "verify-round-1", "verified"),
    ("train-grpo-round-1", "policy", "import-base-model", "artifact"),
    ("generate-rollouts-round-2", "tasks", "select", "selected"),
    ("generate-rollouts-round-2", "policy", "train-grpo-round-1", "model"),
    ("verify-round-2", "tasks", "select", "selected"),
    ("verify-round-2", "rollouts", "generate-rollouts-round-2", "rollouts"),
    ("train-grpo-round-2", "samples", "generate-rollouts-round-2", "samples"),
    ("train-grpo-round-2", "verified", "verify-round-2", "verified"),
    ("train-grpo-round-2", "policy", "train-grpo-round-1", "model"),
    ("summarize-run-round-1", "difficulty", "estimate-difficulty", "metrics"),
    ("summarize-run-round-1", "selection", "select", "metrics"),
    ("summarize-run-round-1", "generated", "generate-rollouts-round-1", "metrics"),
    ("summarize-run-round-1", "verified", "verify-round-1", "metrics"),
    ("summarize-run-round-1", "trained", "train-grpo-round-1", "metrics"),
    ("summarize-run", "difficulty", "estimate-difficulty", "metrics"),
    ("summarize-run", "selection", "select", "metrics"),
    ("summarize-run", "generated", "generate-rollouts-round-2", "metrics"),
    ("summarize-run", "verified", "verify-round-2", "metrics"),
    ("summarize-run", "trained", "train-grpo-round-2", "metrics"),
    ("summarize-run", "earlier", "summarize-run-round-1", "rounds"),
]


def _artifact_edges(dag, by_display) -> set[tuple[str, str]]:
    name_of = {v: k for k, v in by_display.items()}
    return {
        (name_of[task], input_name)
        for task, spec in dag.items()
        for input_name, source in spec.get("inputs", {}).get("artifacts", {}).items()
        if "taskOutputArtifact" in source
    }


@pytest.mark.parametrize(
    ("consumer", "input_name", "producer", "output"), EDGES, ids=[f"{c}.{i}" for c, i, *_ in EDGES]
)
def test_artifact_edge(compiled, consumer, input_name, producer, output):
    _, dag, by_display = compiled
    source = dag[by_display[consumer]]["inputs"]["artifacts"][input_name]["taskOutputArtifact"]
    assert source == {"producerTask": by_display[producer], "outputArtifactKey": output}


@pytest.mark.parametrize(
    ("consumer", "input_name", "producer", "output"), FULL_EDGES, ids=[f"{c}.{i}" for c, i, *_ in FULL_EDGES]
)
def test_full_artifact_edge(compiled_full, consumer, input_name, producer, output):
    _, dag, by_display = compiled_full
    source = dag[by_display[consumer]]["inputs"]["artifacts"][input_name]["taskOutputArtifact"]
    assert source == {"producerTask": by_display[producer], "outputArtifactKey": output}


def test_cold_start_pipeline_trains_from_the_sft_model(compiled_cold_start):
    pipeline, dag, by_display = compiled_cold_start
    assert _artifact_edges(dag, by_display) == {(c, i) for c, i, _, _ in COLD_START_EDGES}
    for consumer, input_name, producer, output in COLD_START_EDGES:
        source = dag[by_display[consumer]]["inputs"]["artifacts"][input_name]["taskOutputArtifact"]
        assert source == {"producerTask": by_display[producer], "outputArtifactKey": output}, consumer
    params = dag[by_display["cold-start"]]["inputs"]["parameters"]
    assert params["epochs"] == {"componentInputParameter": "cold_start_epochs"}
    label = pipeline.spec["components"][dag[by_display["cold-start"]]["componentRef"]["name"]][
        "executorLabel"
    ]
    assert gpu_problems(pipeline, label, gpus=1) == []


def test_the_dag_has_no_other_artifact_edges_and_waits_for_validation(compiled):
    _, dag, by_display = compiled
    assert _artifact_edges(dag, by_display) == {(c, i) for c, i, _, _ in EDGES}
    assert ROUNDS == 2 and len([d for d in by_display if d.startswith("train-grpo-round-")]) == ROUNDS
    assert "validate" in dag[by_display["estimate-difficulty"]]["dependentTasks"]


def test_full_has_no_other_artifact_edges_and_passes_the_loop_settings(compiled_full):
    pipeline, dag, by_display = compiled_full
    assert _artifact_edges(dag, by_display) == {(c, i) for c, i, _, _ in FULL_EDGES}
    assert "validate" in dag[by_display["estimate-difficulty"]]["dependentTasks"]
    params = dag[by_display["rl-loop"]]["inputs"]["parameters"]
    for name in ("mode", "steps", "batch_groups", "group_size", "max_staleness", "save_every", "engine_url"):
        assert params[name] == {"componentInputParameter": name}, name
    root = pipeline.spec["root"]["inputDefinitions"]["parameters"]
    assert root["mode"]["defaultValue"] == "colocated"


def test_rl_gpus_sizes_the_loop_step_when_the_run_starts(compiled_full, compiled_cold_start):
    for pipeline, dag, by_display in (compiled_full, compiled_cold_start):

        def label(display: str, pipeline=pipeline, dag=dag, by_display=by_display) -> str:
            return pipeline.spec["components"][dag[by_display[display]]["componentRef"]["name"]][
                "executorLabel"
            ]

        loop = label("rl-loop")
        # the count is the parameter's placeholder, resolved by KFP when the run starts: no literal count
        assert pipeline.resources(loop)["accelerator"] == {
            "resourceCount": "{{$.inputs.parameters['pipelinechannel--rl_gpus']}}",
            "resourceType": "nvidia.com/gpu",
            "type": "nvidia.com/gpu",
        }
        params = dag[by_display["rl-loop"]]["inputs"]["parameters"]
        assert params["pipelinechannel--rl_gpus"] == {"componentInputParameter": "rl_gpus"}
        assert params["accelerator_count"] == {
            "runtimeValue": {"constant": "{{$.inputs.parameters['pipelinechannel--rl_gpus']}}"}
        }
        assert params["nproc"] == {"componentInputParameter": "rl_gpus"}  # the trainer ranks follow it
        assert pipeline.spec["root"]["inputDefinitions"]["parameters"]["rl_gpus"] == {
            "defaultValue": 1.0,
            "isOptional": True,
            "parameterType": "NUMBER_INTEGER",
        }
        assert pipeline.accelerator_count(loop) == "rl_gpus"
        assert gpu_problems(pipeline, loop, gpus=1) == [
            f"{loop}: accelerator count set at run time by 'rl_gpus', expected 1"
        ]
        for display in ("estimate-difficulty", "evaluate"):  # the other GPU steps keep a fixed count
            assert pipeline.accelerator_count(label(display)) == 1, display


def test_gpu_steps_and_s3_credentials(compiled, compiled_full):
    full, full_dag, full_display = compiled_full

    def full_label(display: str) -> str:
        return full.spec["components"][full_dag[full_display[display]]["componentRef"]["name"]][
            "executorLabel"
        ]

    for display in ("estimate-difficulty", "evaluate"):
        assert gpu_problems(full, full_label(display), gpus=1) == [], display
    assert gpu_problems(full, full_label("rl-loop"), gpus="rl_gpus") == []
    assert secret_env_problems(full, full_label("rl-loop")) == []
    pipeline, dag, by_display = compiled

    def label(display):
        return pipeline.spec["components"][dag[by_display[display]]["componentRef"]["name"]]["executorLabel"]

    for display in ("estimate-difficulty", "generate-rollouts-round-1", "train-grpo-round-2"):
        assert gpu_problems(pipeline, label(display), gpus=1) == [], display
    for display in ("generate-rollouts-round-2", "train-grpo-round-1"):
        assert secret_env_problems(pipeline, label(display)) == [], display
    assert gpu_problems(pipeline, label("verify-round-1"))  # a CPU step: no GPU placement


@pytest.mark.slow
def test_full_pipeline_runs_locally_on_the_tiny_model(tmp_path):
    """The real DAG under kfp.local: real components, the real tiny model, real sandboxes, tiny sizes; the RL
    loop in colocated async mode."""
    from pipelines.demo import demo_arguments

    # 3 SWE tasks: 2 selected, 1 held out; the tiny model solves none, so the loop trains on the instruction
    # family (4 tasks, 2 held out), 2 steps of one group of 2
    args = {
        **demo_arguments(MINIREPO, max_tasks=3),
        "difficulty_n": 1,
        "test_fraction": 0.34,
        "family_train_tasks": 4,
        "family_held_out_tasks": 2,
        "family_specs_json": '[{"harness": "chat", "limits": {"tokens": 8}}]',
        "steps": 2,
        "batch_groups": 1,
        "group_size": 2,
        "eval_k": 1,
    }
    result = run_local("harnessrl-full", args, tmp_path / "full")
    assert result.status == "succeeded", result.failed_log[-20:]
    index = json.loads(result.index_path.read_text())
    steps = set(index["tasks"])
    assert {
        "synthesize",
        "clean",
        "validate",
        "estimate-difficulty",
        "select",
        "task-family",
        "rl-loop",
        "evaluate",
        "summarize-rl-run",
    } <= steps
    loop = index["tasks"]["rl-loop"]
    assert loop["status"] == "succeeded"
    assert Path(loop["outputs"]["model"]["path"]).is_dir()
    rows = (Path(loop["outputs"]["tensorboard"]["path"]) / "steps.jsonl").read_text().splitlines()
    assert [json.loads(r)["mode"] for r in rows] == ["colocated", "colocated"]
    evaluation = json.loads(Path(index["tasks"]["evaluate"]["outputs"]["evaluation"]["path"]).read_text())
    assert {r["policy"] for r in evaluation["results"]} == {"base", "trained"}
    # what the replies looked like, per RL step and per evaluated policy, from the gateway records
    assert all(json.loads(r)["mean_reply_tokens"] > 0 for r in rows)
    assert all(r["mean_reply_tokens"] > 0 for r in evaluation["results"])
    family = json.loads(Path(index["tasks"]["task-family"]["outputs"]["metrics"]["path"]).read_text())
    assert family["family_swe"] == 0.0 and family["test"] == 2.0  # no SWE headroom: the instruction family
    assert family["harness_chat"] == 1.0 and family["harness_claude-code"] == 0.0
    summary = (result.run_dir / "reports" / "summarize-rl-run.md").read_text()  # kfp.local: component name
    assert (
        summary.startswith("# Run summary\n\n**Training")
        and "Held-out pass@1 after training vs before" in summary
    )
    assert "trained and evaluated through chat" in summary.splitlines()[2]  # the verdict names the harness
    assert "SWE tasks gave the policy no headroom" in summary
    assert "## One held-out request, base and trained" in summary and "**trained** (reward" in summary
