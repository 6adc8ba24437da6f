"""KFP components that run the RL stage on a cluster as one KubeRay RayJob (thin: the work is in
components/launch_rl/rayjob.py). `launch_rl` creates the RayJob, streams the driver's log into this step's log (the KFP UI
shows it live) and deletes the RayJob when it ends; `delete_rl_job` deletes it whatever happened, as the exit
handler `pipelines.rl_cluster.add_rl_on_ray` puts around the launcher. Both name the RayJob from the run's id,
so they agree without passing outputs (an exit task may not consume its handler's outputs)."""

from kfp.dsl import Metrics, Output

from components.common import component


@component
def launch_rl(
    run_id: str,
    rl_args_json: str,
    metrics: Output[Metrics],
    namespace: str = "harnessrl",
    image: str = "",
    gpu_image: str = "",
    workers: int = 1,
    gpus_per_worker: int = 1,
    driver_gpus: float = 1.0,
    worker_cpu: str = "8",
    worker_memory: str = "64Gi",
    timeout_s: float = 0.0,
    poll_s: float = 5.0,
    data_pvc: str = "",
    nproc: int = 1,
    nnodes: int = 1,
):
    """`harnessrl stage rl <rl_args>` as a RayJob: `workers` GPU workers with `gpus_per_worker` GPUs each,
    the driver (trainer) on `driver_gpus` of them. image "" = the project image; timeout_s 0 = the RayJob's
    own deadline; data_pvc: a PersistentVolumeClaim mounted at /data on every Ray pod (task sets, outputs);
    nproc > 1: that many trainer ranks in the driver (`--nproc`), which then gets at least `nproc` GPUs;
    nnodes > 1: trainer ranks on that many nodes, the driver's and a trainer worker group of nnodes - 1 pods of
    `nproc` GPUs each (`--nnodes --trainer-nodes ray`). All of them are read when the step runs, so a pipeline
    may pass its parameters."""
    import json

    from components.launch_rl.rayjob import RayJobSpec, WorkerGroup, rayjob_name, run_rayjob
    from harnessrl.cluster import IMAGE
    from harnessrl.logs import configure_logging

    configure_logging()
    args = json.loads(rl_args_json)
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"rl_args_json: expected a JSON list of strings, got {rl_args_json[:200]!r}")
    group = WorkerGroup(replicas=workers, gpus=gpus_per_worker, cpu=worker_cpu, memory=worker_memory)
    spec = RayJobSpec(
        name=rayjob_name(run_id),
        rl_args=args,
        namespace=namespace,
        gpu_image=gpu_image or None,
        workers=(group,),
        driver_gpus=driver_gpus,
        nproc=nproc,
        nnodes=nnodes,
        image=image or IMAGE,
        data_pvc=data_pvc or None,
    )
    print(f"RayJob {namespace}/{spec.name}: {spec.entrypoint}", flush=True)
    result = run_rayjob(
        spec, sink=lambda line: print(line, flush=True), timeout_s=timeout_s or None, poll_s=poll_s
    )
    metrics.log_metric("wall_s", round(result.wall_s, 1))
    metrics.log_metric("driver_log_lines", result.log_lines)


@component
def delete_rl_job(run_id: str, namespace: str = "harnessrl"):
    """Deletes the run's RayJob (and so its Ray cluster); nothing to do when it is already gone."""
    from components.launch_rl.rayjob import RayJobClient, rayjob_name
    from harnessrl.logs import configure_logging

    configure_logging()
    RayJobClient().delete(rayjob_name(run_id), namespace)
    print(f"RayJob {namespace}/{rayjob_name(run_id)} deleted (or already gone)", flush=True)
