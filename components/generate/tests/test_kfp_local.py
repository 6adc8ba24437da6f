"""Real kfp.local runs (SubprocessRunner, this env) of `generate_rollouts` (against the gateway's fast engine
server: a scripted token API) and `select`."""

import json

from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.taskset import TaskSet
from tests.support.fixtures import requires_bwrap


@requires_bwrap
def test_kfp_local_generate_rollouts_and_select(synth_taskset, tmp_path):
    from kfp import dsl, local

    from components.generate.component import generate_rollouts
    from components.select_tasks.component import select
    from harnessrl.tinymodel import load_tokenizer, tiny_model_dir
    from tests.support.fast_engine import FastEngineServer

    rows = TaskSet.open(synth_taskset).rows()
    estimates = tmp_path / "estimates"
    estimates.mkdir()
    write_jsonl(
        estimates / "pass_counts.jsonl",
        [
            {"instance_id": r["instance_id"], "repo": r["repo"], "n": 4, "n_valid": 4, "passes": p}
            for r, p in zip(rows, [0, 2, 4, 1, 3], strict=False)
        ],
    )
    engine = FastEngineServer(
        load_tokenizer(),
        [
            {"text": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'},
            {"text": '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'},
        ],
    )
    engine.start()
    specs = [{"harness": "react", "limits": {"turns": 4}}]

    @dsl.pipeline(name="generate-and-select")
    def generate_and_select(
        tasks_uri: str, policy_uri: str, estimates_uri: str, engine_url: str, specs_json: str
    ):
        tasks = dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset, reimport=False)
        policy = dsl.importer(artifact_uri=policy_uri, artifact_class=dsl.Model, reimport=False)
        est = dsl.importer(artifact_uri=estimates_uri, artifact_class=dsl.Dataset, reimport=False)
        select(tasks=tasks.output, difficulty=est.output, k_all_fail=1, test_fraction=0.0, seed=0)
        generate_rollouts(
            tasks=tasks.output,
            policy=policy.output,
            group_size=1,
            specs_json=specs_json,
            concurrency=2,
            engine_url=engine_url,
        )

    try:
        local.init(
            runner=local.SubprocessRunner(use_venv=False),
            pipeline_root=str(tmp_path / "root"),
            raise_on_error=True,
        )
        generate_and_select(
            tasks_uri=str(synth_taskset),
            policy_uri=str(tiny_model_dir()),
            estimates_uri=str(estimates),
            engine_url=engine.base_url,
            specs_json=json.dumps(specs),
        )
    finally:
        engine.stop()
    root = tmp_path / "root"
    rollouts = list(read_jsonl(next(root.rglob("rollouts.jsonl"))))
    assert len(rollouts) == len(rows)
    assert all(
        (r["rollout_status"], r["finish_reason"], r["turns"]) == ("ok", "submitted", 2) for r in rollouts
    )
    assert len(list(root.rglob("samples/samples.parquet"))) == 1
    selected = next(p.parent for p in root.rglob("selection.jsonl") if (p.parent / "tasks.jsonl").is_file())
    kept = {r["instance_id"] for r in TaskSet.open(selected).rows()}
    mixed = {r["instance_id"] for r, p in zip(rows, [0, 2, 4, 1, 3], strict=False) if 0 < p < 4}
    all_fail = {rows[0]["instance_id"]}
    assert kept == mixed | all_fail
    metrics = [p for p in root.rglob("metrics") if p.is_file()]
    assert len(metrics) == 2
