"""The RL launcher: compiled into a pipeline behind an exit handler, and run for real by kfp.local (subprocess
runner) against a loopback RayJob API reached through $KUBECONFIG."""

import json
from typing import Any, cast

import pytest
import yaml

from components.launch_rl.rayjob import rayjob_name
from components.launch_rl.tests.ray_api import RayAPI


def test_the_exit_handler_deletes_the_rayjob_of_the_same_run(tmp_path):
    from kfp import compiler, dsl

    from pipelines.rl_cluster import add_rl_on_ray

    @dsl.pipeline(name="rl-on-ray-check")
    def rl_on_ray(tasks_uri: str = "s3://harnessrl/tasks"):
        add_rl_on_ray(["--tasks", "s3://harnessrl/tasks", "--steps", "5"], workers=2, gpus_per_worker=8)

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(cast(Any, rl_on_ray), str(path))
    spec = yaml.safe_load(path.read_text())
    root = spec["root"]["dag"]["tasks"]
    cleanup = root["delete-rl-job"]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert cleanup["dependentTasks"] == ["exit-handler-1"]
    inner = spec["components"][root["exit-handler-1"]["componentRef"]["name"]]["dag"]["tasks"]
    launch = inner["launch-rl"]["inputs"]["parameters"]
    run_id = "{{$.pipeline_job_uuid}}"
    assert cleanup["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == run_id
    assert launch["run_id"]["runtimeValue"]["constant"] == run_id
    assert json.loads(launch["rl_args_json"]["runtimeValue"]["constant"]) == [
        "--tasks",
        "s3://harnessrl/tasks",
        "--steps",
        "5",
    ]
    assert launch["gpus_per_worker"]["runtimeValue"]["constant"] == 8


def test_the_cluster_sizes_come_from_pipeline_parameters(tmp_path):
    from kfp import compiler, dsl

    from pipelines.rl_cluster import add_rl_on_ray

    @dsl.pipeline(name="rl-on-ray-sized-per-run")
    def rl_on_ray(rl_args_json: str, workers: int = 2, gpus_per_worker: int = 8, rl_gpus: int = 8):
        add_rl_on_ray(rl_args_json, workers=workers, gpus_per_worker=gpus_per_worker, nproc=rl_gpus)

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(cast(Any, rl_on_ray), str(path))
    spec = yaml.safe_load(path.read_text())
    handler = spec["components"][spec["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]]
    launch = handler["dag"]["tasks"]["launch-rl"]["inputs"]["parameters"]
    for name, param in (
        ("rl_args_json", "rl_args_json"),
        ("workers", "workers"),
        ("gpus_per_worker", "gpus_per_worker"),
        ("nproc", "rl_gpus"),
    ):
        assert launch[name] == {"componentInputParameter": f"pipelinechannel--{param}"}, name
        assert handler["inputDefinitions"]["parameters"][f"pipelinechannel--{param}"]
    assert spec["root"]["inputDefinitions"]["parameters"]["rl_gpus"]["defaultValue"] == 8


@pytest.fixture
def ray_api(tmp_path, monkeypatch):
    api = RayAPI(lines=3).start()
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield api
    api.stop()


def test_kfp_local_launch_streams_the_driver_log_and_deletes(ray_api, tmp_path, capfd):
    from kfp import local

    from components.launch_rl.component import delete_rl_job, launch_rl

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    task = launch_rl(
        run_id="run-1",
        rl_args_json=json.dumps(["--steps", "3"]),
        workers=1,
        gpus_per_worker=2,
        nproc=2,
        poll_s=0.05,
    )
    out = capfd.readouterr().out
    assert "step 0 reward 0.0" in out and "step 2 reward 0.2" in out
    metrics: Any = task.outputs["metrics"]
    assert metrics.metadata["driver_log_lines"] == 3
    name = rayjob_name("run-1")
    posts = [p for m, p, _ in ray_api.requests if m == "POST"]
    deletes = [p for m, p, _ in ray_api.requests if m == "DELETE"]
    assert posts == ["/apis/ray.io/v1/namespaces/harnessrl/rayjobs"]
    assert deletes == [f"/apis/ray.io/v1/namespaces/harnessrl/rayjobs/{name}"] and not ray_api.objects
    (created,) = ray_api.created  # the sizes given at run time: two trainer ranks, a GPU each
    assert created["spec"]["entrypoint"] == "harnessrl stage rl --steps 3 --nproc 2"
    assert created["spec"]["entrypointNumGpus"] == 2
    assert created["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"] == {"num-gpus": "2"}
    delete_rl_job(run_id="run-1")  # the exit handler after a normal end: nothing left, no error
    assert [m for m, _, _ in ray_api.requests].count("DELETE") == 2
