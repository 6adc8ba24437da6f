"""The RL stage on a cluster as one Ray job: a KubeRay `RayJob` (ray.io/v1, operator >= 1.1) that brings up its
own Ray cluster, runs `harnessrl stage rl ...` as the driver, and tears the cluster down when the job ends.

    render_rayjob(spec: RayJobSpec) -> dict                       the RayJob manifest
    run_rayjob(spec, api_client=None, sink=print) -> RayJobResult  create -> wait + stream logs -> delete

The driver (the RL loop: trainer, engines, gateway, rollout workers) is placed by `entrypointNumGpus` onto a
GPU worker; the worker groups carry the GPU placement (accelerator count, node selector, tolerations) and the
S3 credentials come from the Secret / ConfigMap the pipeline steps use (names only, values stay in the
cluster). KubeRay runs the submitter as a Kubernetes Job named like the RayJob (`ray job submit`, which tails
the driver's output); its pod log is what gets streamed. A rerun with the same name adopts the RayJob that is
already there (idempotent retries of the launcher step).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import yaml

from harnessrl.cluster import (
    GPU_NODE_SELECTOR,
    GPU_TOLERATIONS,
    IMAGE,
    S3_SECRET_KEYS,
    S3_SECRET_NAME,
    STORE_CONFIG_KEYS,
    STORE_CONFIG_MAP,
)
from harnessrl.rl.nodes import TRAINER_NODE

logger = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
RAY_VERSION = "2.60.0"  # the ray pinned in pyproject.toml (the image installs it); as manifests/base
SUBMITTER_CONTAINER = "ray-job-submitter"
NAME_RE = re.compile(r"[^a-z0-9-]")


class JobStatus(StrEnum):
    """RayJob `status.jobStatus` (the Ray job's own status)."""

    NEW = ""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class DeploymentStatus(StrEnum):
    """RayJob `status.jobDeploymentStatus` (cluster + submission lifecycle)."""

    NEW = ""
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"


TERMINAL_JOB = {JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED}
TERMINAL_DEPLOYMENT = {DeploymentStatus.COMPLETE, DeploymentStatus.FAILED}


class RayJobFailed(RuntimeError):
    """The RayJob ended without the Ray job succeeding, or did not end in time."""


def rayjob_name(run_id: str, prefix: str = "harnessrl-rl") -> str:
    """A DNS-1123 name fixed by the pipeline run, so the launcher and its exit handler agree on it."""
    digest = hashlib.blake2b(run_id.encode(), digest_size=5).hexdigest()
    return f"{NAME_RE.sub('-', prefix.lower())[:40].strip('-')}-{digest}"


@dataclass(frozen=True)
class WorkerGroup:
    name: str = "gpu-workers"
    replicas: int = 1
    gpus: int = 1  # per worker pod
    cpu: str = "8"
    memory: str = "64Gi"
    accelerator: str = "nvidia.com/gpu"
    node_selector: Mapping[str, str] = field(default_factory=lambda: dict(GPU_NODE_SELECTOR))
    tolerations: Sequence[Mapping[str, str]] = GPU_TOLERATIONS
    shm: str = "16Gi"  # /dev/shm (NCCL, torch dataloaders)
    ray_resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources of each pod

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.gpus < 0:
            raise ValueError(
                f"worker group {self.name!r}: replicas >= 1 and gpus >= 0, got {self.replicas}, {self.gpus}"
            )


@dataclass(frozen=True)
class RayJobSpec:
    name: str
    rl_args: Sequence[str]  # arguments of `harnessrl stage rl`
    namespace: str = "harnessrl"
    image: str = IMAGE
    gpu_image: str | None = None  # workers' image (a CUDA build); default: `image`
    workers: Sequence[WorkerGroup] = (WorkerGroup(),)
    driver_gpus: float = 1.0  # entrypointNumGpus: the driver (trainer) runs on a GPU worker
    nproc: int = (
        1  # trainer ranks in the driver (`--nproc`, torchrun in its pod): it gets at least that many GPUs
    )
    nnodes: int = 1  # nodes of trainer ranks: the driver's, and a trainer worker group of nnodes - 1 pods
    head_cpu: str = "4"
    head_memory: str = "16Gi"
    env: Mapping[str, str] = field(
        default_factory=dict
    )  # runtime env vars (no secrets: those come from s3_secret)
    s3_secret: str | None = S3_SECRET_NAME
    store_config_map: str | None = STORE_CONFIG_MAP
    data_pvc: str | None = None  # a PersistentVolumeClaim (task sets, outputs) mounted on every Ray pod
    data_mount: str = "/data"
    active_deadline_s: int = 48 * 3600
    ttl_after_finished_s: int = 600
    ray_version: str = RAY_VERSION

    @property
    def entrypoint(self) -> str:
        ranks = ["--nproc", str(self.nproc)] if self.nproc > 1 else []
        if self.nnodes > 1:  # node 0 (the driver) places the others on the trainer group (harnessrl.rl.nodes)
            ranks += ["--nnodes", str(self.nnodes), "--trainer-nodes", "ray"]
        return shlex.join(["harnessrl", "stage", "rl", *self.rl_args, *ranks])

    def worker_groups(self) -> list[WorkerGroup]:
        """The given groups, and with nnodes > 1 the trainer nodes': nnodes - 1 pods of `nproc` GPUs each,
        shaped like the widest group, each offering one trainer node slot."""
        if self.nnodes <= 1:
            return list(self.workers)
        widest = max(self.workers, key=lambda g: g.gpus)
        trainer = replace(
            widest,
            name="trainer-nodes",
            replicas=self.nnodes - 1,
            gpus=self.nproc,
            ray_resources={TRAINER_NODE: 1},
        )
        return [*self.workers, trainer]

    @property
    def entrypoint_gpus(self) -> float:
        return max(self.driver_gpus, self.nproc) if self.nproc > 1 else self.driver_gpus


def _env(spec: RayJobSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if spec.s3_secret:
        env += [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": spec.s3_secret, "key": key}}}
            for var, key in S3_SECRET_KEYS.items()
        ]
    if spec.store_config_map:
        env += [
            {
                "name": var,
                "valueFrom": {
                    "configMapKeyRef": {"name": spec.store_config_map, "key": key, "optional": True}
                },
            }
            for var, key in STORE_CONFIG_KEYS.items()
        ]
    return env


def _container(
    name: str, image: str, spec: RayJobSpec, resources: dict[str, str], ports: list | None = None
) -> dict:
    c: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(spec),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }
    if ports:
        c["ports"] = ports
    return c


def _with_data(pod: dict[str, Any], spec: RayJobSpec) -> dict[str, Any]:
    if spec.data_pvc:
        pod.setdefault("volumes", []).append(
            {"name": "data", "persistentVolumeClaim": {"claimName": spec.data_pvc}}
        )
        pod["containers"][0].setdefault("volumeMounts", []).append(
            {"name": "data", "mountPath": spec.data_mount}
        )
    return pod


def render_rayjob(spec: RayJobSpec) -> dict[str, Any]:
    widest = max((g.gpus for g in spec.workers), default=0)
    if spec.nproc < 1 or (spec.nproc > 1 and spec.nproc > widest):
        raise ValueError(
            f"nproc {spec.nproc}: the driver's trainer ranks need one GPU each on one worker, and the widest "
            f"worker group has {widest} GPU(s) per pod; raise gpus_per_worker or lower nproc"
        )
    head = _container(
        "ray-head",
        spec.image,
        spec,
        {"cpu": spec.head_cpu, "memory": spec.head_memory},
        [
            {"name": "gcs", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ],
    )
    if spec.nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {spec.nnodes}")
    groups = []
    for g in spec.worker_groups():
        resources = {"cpu": g.cpu, "memory": g.memory}
        if g.gpus:
            resources[g.accelerator] = str(g.gpus)
        worker = _container("ray-worker", spec.gpu_image or spec.image, spec, resources)
        worker["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        pod: dict[str, Any] = {
            "containers": [worker],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": g.shm}}],
        }
        if g.gpus:
            pod["nodeSelector"] = dict(g.node_selector)
            pod["tolerations"] = [dict(t) for t in g.tolerations]
        groups.append(
            {
                "groupName": g.name,
                "replicas": g.replicas,
                "minReplicas": g.replicas,
                "maxReplicas": g.replicas,
                "rayStartParams": {
                    "num-gpus": str(g.gpus),
                    # KubeRay puts `--resources=<value>` in a shell command: JSON inside double quotes, as its
                    # docs write it ('"{\"TPU\": 4}"')
                    **(
                        {"resources": json.dumps(json.dumps(dict(g.ray_resources)))}
                        if g.ray_resources
                        else {}
                    ),
                },
                "template": {"spec": _with_data(pod, spec)},
            }
        )
    body: dict[str, Any] = {
        "entrypoint": spec.entrypoint,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
        "activeDeadlineSeconds": spec.active_deadline_s,
        "submissionMode": "K8sJobMode",
        "rayClusterSpec": {
            "rayVersion": spec.ray_version,
            "headGroupSpec": {
                "serviceType": "ClusterIP",
                "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
                "template": {"spec": _with_data({"containers": [head]}, spec)},
            },
            "workerGroupSpecs": groups,
        },
    }
    if spec.entrypoint_gpus:
        body["entrypointNumGpus"] = spec.entrypoint_gpus
    if spec.env:
        body["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": dict(spec.env)}, sort_keys=True)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": {"app.kubernetes.io/part-of": "harnessrl", "app.kubernetes.io/component": "rl"},
        },
        "spec": body,
    }


@dataclass
class RayJobResult:
    name: str
    job_status: JobStatus
    deployment_status: DeploymentStatus
    message: str = ""
    wall_s: float = 0.0
    log_lines: int = 0

    @property
    def succeeded(self) -> bool:
        return self.job_status is JobStatus.SUCCEEDED


class RayJobClient:
    """The API calls of one RayJob's lifecycle (CustomObjectsApi for the RayJob, CoreV1Api for the logs)."""

    def __init__(self, api_client: Any = None, poll_s: float = 5.0) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:  # outside a pod: $KUBECONFIG (read now) or ~/.kube/config
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
            api_client = client.ApiClient()
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.poll_s = poll_s

    def create(self, manifest: dict[str, Any]) -> bool:
        """Creates the RayJob; False when one of that name already exists (adopted, not replaced)."""
        from kubernetes.client.exceptions import ApiException

        ns = manifest["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
        except ApiException as e:
            if e.status == 409:
                logger.info("RayJob %s/%s exists: waiting for it", ns, manifest["metadata"]["name"])
                return False
            raise
        return True

    def status(self, name: str, namespace: str) -> tuple[JobStatus, DeploymentStatus, str]:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        st = obj.get("status") or {}
        job = (
            JobStatus(st.get("jobStatus", "")) if st.get("jobStatus", "") in set(JobStatus) else JobStatus.NEW
        )
        dep_raw = st.get("jobDeploymentStatus", "")
        dep = DeploymentStatus(dep_raw) if dep_raw in set(DeploymentStatus) else DeploymentStatus.NEW
        return job, dep, str(st.get("message") or st.get("reason") or "")

    def delete(self, name: str, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def stream_logs(
        self, name: str, namespace: str, sink: Callable[[str], None], stop: threading.Event
    ) -> int:
        """Follows the submitter pods' logs (the Job may replace a pod) until `stop` is set; then follows the
        pods it has not seen yet (their logs are complete by then) and returns the number of lines."""
        from kubernetes.client.exceptions import ApiException

        lines, followed = 0, set()
        while True:
            final = stop.is_set()
            try:
                pods = self.core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
            except (
                Exception
            ) as e:  # the API is unreachable for a moment: the job's status decides, not the log
                logger.warning("listing the submitter pods of %s/%s: %s", namespace, name, e)
                pods = []
            ready = [
                p.metadata.name
                for p in pods
                if p.metadata.name not in followed
                and (p.status.phase or "") in ("Running", "Succeeded", "Failed")
            ]
            for pod in ready:
                followed.add(pod)
                try:
                    lines += self._follow(pod, namespace, sink)
                except ApiException as e:
                    logger.warning("log of %s/%s: %s %s", namespace, pod, e.status, e.reason)
                except (
                    Exception
                ) as e:  # the stream broke (pod deleted, API server restarted): the job goes on
                    logger.warning("log of %s/%s broke off: %s", namespace, pod, e)
            if final:
                return lines
            if not ready:
                stop.wait(self.poll_s)

    def _follow(self, pod: str, namespace: str, sink: Callable[[str], None]) -> int:
        resp = self.core.read_namespaced_pod_log(
            pod, namespace, container=SUBMITTER_CONTAINER, follow=True, _preload_content=False
        )
        lines, buf = 0, b""
        try:
            for chunk in resp.stream(4096):
                buf += chunk
                *done, buf = buf.split(b"\n")
                for line in done:
                    sink(line.decode("utf-8", "replace"))
                    lines += 1
        finally:
            resp.release_conn()
        if buf:
            sink(buf.decode("utf-8", "replace"))
            lines += 1
        return lines


def run_rayjob(
    spec: RayJobSpec,
    api_client: Any = None,
    sink: Callable[[str], None] = print,
    timeout_s: float | None = None,
    poll_s: float = 5.0,
    delete: bool = True,
) -> RayJobResult:
    """Create -> wait (streaming the driver's log to `sink`) -> delete (also on failure, unless `delete=False`:
    the pipeline's exit handler deletes it then). Raises RayJobFailed unless the Ray job succeeded."""
    api = RayJobClient(api_client, poll_s=poll_s)
    manifest = render_rayjob(spec)
    started = time.monotonic()
    deadline = started + (timeout_s if timeout_s is not None else spec.active_deadline_s + 600)
    stop = threading.Event()
    counted: list[int] = []
    logs = threading.Thread(
        target=lambda: counted.append(api.stream_logs(spec.name, spec.namespace, sink, stop)), daemon=True
    )
    try:
        api.create(manifest)
        logs.start()
        while True:
            job, dep, message = api.status(spec.name, spec.namespace)
            if job in TERMINAL_JOB or dep in TERMINAL_DEPLOYMENT:
                break
            if time.monotonic() > deadline:
                raise RayJobFailed(
                    f"RayJob {spec.namespace}/{spec.name} not finished after {time.monotonic() - started:.0f} s "
                    f"(job {job or 'new'}, deployment {dep or 'new'})"
                )
            time.sleep(poll_s)
        stop.set()
        logs.join(timeout=60)  # the submitter's log ends with the job
    finally:
        stop.set()
        if delete:
            api.delete(spec.name, spec.namespace)
        if logs.is_alive():  # deleting the job ends the submitter pod and its log
            logs.join(timeout=5)
    result = RayJobResult(spec.name, job, dep, message, time.monotonic() - started, sum(counted))
    if not result.succeeded:
        raise RayJobFailed(
            f"RayJob {spec.namespace}/{spec.name}: job {job or 'not submitted'}, deployment {dep}"
            + (f": {message}" if message else "")
        )
    return result
