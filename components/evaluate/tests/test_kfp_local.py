"""The `evaluate` component alone under kfp.local (SubprocessRunner, this env), end to end on the real tiny model
(SmolLM2-135M on CPU): 2 tasks, k=2, a few tokens per turn."""

import json

import pytest

from harnessrl.evaluate.results import SCHEMA
from harnessrl.taskset import TaskSet, write_taskset
from tests.support.fixtures import requires_bwrap

SPECS = [
    {
        "harness": "react",
        "limits": {"turns": 1, "tokens": 4096, "wall_s": 900},
        "options": {"max_tokens_per_turn": 12, "min_tokens_per_turn": 8},
    }
]


@requires_bwrap
@pytest.mark.slow
def test_kfp_local_evaluate_on_the_tiny_model(synth_taskset, tmp_path):
    from kfp import dsl, local

    from components.evaluate.component import evaluate
    from harnessrl.tinymodel import tiny_model_dir

    source = TaskSet.open(synth_taskset)
    rows = source.rows()[:2]
    held_out = tmp_path / "held_out"
    write_taskset(held_out, rows, {r["repo"]: source.bundle(r["repo"]) for r in rows}, source="test")

    @dsl.pipeline(name="evaluate-only")
    def evaluate_only(tasks_uri: str, policy_uri: str, specs_json: str):
        tasks = dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset, reimport=False)
        policy = dsl.importer(artifact_uri=policy_uri, artifact_class=dsl.Model, reimport=False)
        evaluate(
            tasks=tasks.output,
            base_policy=policy.output,
            policy=policy.output,
            k=2,
            specs_json=specs_json,
            engine_url="",
            seed=0,
        )

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        raise_on_error=True,
    )
    evaluate_only(tasks_uri=str(held_out), policy_uri=str(tiny_model_dir()), specs_json=json.dumps(SPECS))
    root = tmp_path / "root"
    evaluation = json.loads(next(p for p in root.rglob("evaluation") if p.is_file()).read_text())
    assert evaluation["schema"] == SCHEMA and evaluation["tasks"]["count"] == 2
    results = {r["policy"]: r for r in evaluation["results"]}
    assert set(results) == {"base", "trained"}
    for r in results.values():
        assert (r["mode"], r["k"], r["rollouts"], r["tasks"]) == ("sampled", 2, 4, 2)
        # every rollout ran to an end and was graded (the tiny model rarely fixes anything: 0 or 1 each)
        assert r["graded"] == 4 and r["excluded"] == {} and 0 <= r["resolved"] <= 4, r
        assert r["pass_at_1_ci"][0] <= (r["pass_at_1"] or 0.0) <= r["pass_at_1_ci"][1]
    (comparison,) = evaluation["comparisons"]
    assert (comparison["a"], comparison["b"], comparison["tasks"]) == ("base", "trained", 2)
    metrics = json.loads(next(p for p in root.rglob("metrics") if p.is_file()).read_text())
    assert "base_sampled_pass_at_1" in metrics and "trained_vs_base_sampled_diff" in metrics
    html = next(p for p in root.rglob("report_html") if p.is_file()).read_text()
    assert "<img" in html and "pass@1" in html
