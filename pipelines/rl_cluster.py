"""The RL stage on a cluster from a pipeline: `add_rl_on_ray(...)` inside a `@dsl.pipeline` adds the launcher
step (one KubeRay RayJob running `harnessrl stage rl ...`, its driver log streamed into the step's log) inside a
`dsl.ExitHandler` whose exit task deletes the RayJob however the launcher ends (failure, cancel, pod lost).

    @dsl.pipeline
    def full(...):
        ...
        add_rl_on_ray(
            ["--tasks", "/data/tasks", "--out", "/data/rl/run-1", "--mode", "colocated", "--steps", "200"],
            workers=4, gpus_per_worker=8, data_pvc="harnessrl-data",
        )

The launcher's ServiceAccount (KFP's pipeline-runner) may create / get / delete RayJobs and read pod logs in the
RayJob namespace (manifests/base/rayjob-launcher-rbac.yaml). The launcher itself needs no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kfp import dsl
from kfp.dsl import pipeline_channel

from components.launch_rl.component import delete_rl_job, launch_rl


def add_rl_on_ray(
    rl_args: Sequence[str] | str,
    *,
    namespace: str = "harnessrl",
    workers: int = 1,
    gpus_per_worker: int = 1,
    driver_gpus: float = 1.0,
    worker_cpu: str = "8",
    worker_memory: str = "64Gi",
    image: str = "",
    gpu_image: str = "",
    timeout_s: float = 0.0,
    data_pvc: str = "",
    nproc: int = 1,
    nnodes: int = 1,
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> dsl.PipelineTask:
    """`rl_args`: the arguments of `harnessrl stage rl`, as a list or a JSON string (e.g. a pipeline parameter).
    The sizes (`workers`, `gpus_per_worker`, `driver_gpus`, `nproc`: the driver's trainer ranks, `nnodes`: nodes
    of trainer ranks) may be
    pipeline parameters: the launcher reads them when it runs. Returns the launcher task (to chain evaluation
    after it)."""
    given = isinstance(rl_args, str | pipeline_channel.PipelineChannel)  # a JSON string, maybe a parameter
    args_json = rl_args if given else json.dumps(list(rl_args))
    cleanup = delete_rl_job(run_id=run_id, namespace=namespace)
    cleanup.set_caching_options(False).set_display_name("delete-rayjob")
    with dsl.ExitHandler(cleanup, name="rl-on-ray"):
        launch = launch_rl(
            run_id=run_id,
            rl_args_json=args_json,
            namespace=namespace,
            image=image,
            gpu_image=gpu_image,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            driver_gpus=driver_gpus,
            worker_cpu=worker_cpu,
            worker_memory=worker_memory,
            timeout_s=timeout_s,
            data_pvc=data_pvc,
            nproc=nproc,
            nnodes=nnodes,
        )
        launch.set_caching_options(False).set_display_name("rl-on-ray")
    return launch
