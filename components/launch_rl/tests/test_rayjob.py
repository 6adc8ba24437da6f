"""The RL stage's cluster launcher: the rendered RayJob against KubeRay's own CRD schema, and its lifecycle
(create -> wait + stream the driver log -> delete) driven by the real `kubernetes` client against a loopback
server speaking those API shapes.

components/launch_rl/tests/schemas/kuberay-v1.1.1-rayjob-v1.schema.json is the `v1` openAPIV3Schema of
`ray-operator/config/crd/bases/ray.io_rayjobs.yaml` at KubeRay tag v1.1.1 (github.com/ray-project/kuberay),
the oldest operator manifests/base supports, re-serialized as compact JSON. Validation is strict: unknown
fields are errors, as with `kubectl apply --validate=strict` (the API server would otherwise drop them
silently).
"""

from __future__ import annotations

import copy
import json
import shlex
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from components.launch_rl.rayjob import (
    RayJobFailed,
    RayJobSpec,
    WorkerGroup,
    rayjob_name,
    render_rayjob,
    run_rayjob,
)
from components.launch_rl.tests.ray_api import RayAPI

REPO = Path(__file__).resolve().parents[3]
SCHEMA = Path(__file__).parent / "schemas" / "kuberay-v1.1.1-rayjob-v1.schema.json"


def strict(schema: dict) -> dict:
    """Objects with declared properties accept no others (unless the CRD preserves unknown fields)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


VALIDATOR = jsonschema.Draft7Validator(strict(json.loads(SCHEMA.read_text())))


def validate_rayjob(doc: dict) -> None:
    VALIDATOR.validate(doc)
    cluster = doc["spec"]["rayClusterSpec"]
    for template in [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
            "1.30",
            strict=True,
        )


def spec(**kw) -> RayJobSpec:
    args = ["--tasks", "s3://harnessrl/tasks", "--mode", "colocated", "--steps", "200"]
    return RayJobSpec(name=kw.pop("name", "harnessrl-rl-test"), rl_args=args, **kw)


def test_rendered_rayjob_validates_against_the_kuberay_crd():
    doc = render_rayjob(
        spec(
            workers=(WorkerGroup("trainer", replicas=1, gpus=8), WorkerGroup("rollout", replicas=3, gpus=2)),
            driver_gpus=8,
            env={"HARNESSRL_LOG": "info"},
            gpu_image="example.org/harnessrl:1-cu128",
            data_pvc="harnessrl-data",
        )
    )
    validate_rayjob(doc)
    body = doc["spec"]
    assert (
        shlex.split(body["entrypoint"])[:3] == ["harnessrl", "stage", "rl"]
        and "colocated" in body["entrypoint"]
    )
    assert body["entrypointNumGpus"] == 8 and body["shutdownAfterJobFinishes"] is True
    assert yaml.safe_load(body["runtimeEnvYAML"]) == {"env_vars": {"HARNESSRL_LOG": "info"}}
    trainer, rollout = body["rayClusterSpec"]["workerGroupSpecs"]
    assert trainer["rayStartParams"] == {"num-gpus": "8"} and rollout["replicas"] == 3
    pod = rollout["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["containers"][0]["image"] == "example.org/harnessrl:1-cu128"
    assert (
        pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    )
    head = body["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    for p in (head, pod):
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "harnessrl-data"}} in p["volumes"]
        assert {"name": "data", "mountPath": "/data"} in p["containers"][0]["volumeMounts"]
    env = {e["name"]: e["valueFrom"] for e in pod["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "harnessrl-s3", "key": "AWS_SECRET_ACCESS_KEY"}
    }
    assert "value" not in json.dumps(env)  # names of Secrets only, never values
    broken = copy.deepcopy(doc)
    broken["spec"]["entrypointNumGPUs"] = 8  # typo
    with pytest.raises(jsonschema.ValidationError):
        validate_rayjob(broken)
    broken = copy.deepcopy(doc)
    broken["spec"]["activeDeadlineSeconds"] = "1h"
    with pytest.raises(jsonschema.ValidationError):
        validate_rayjob(broken)


def test_trainer_ranks_in_the_driver_get_a_gpu_each():
    doc = render_rayjob(spec(workers=(WorkerGroup(gpus=4),), nproc=4))
    validate_rayjob(doc)
    assert shlex.split(doc["spec"]["entrypoint"])[-2:] == ["--nproc", "4"]
    assert doc["spec"]["entrypointNumGpus"] == 4  # driver_gpus (1) raised to one GPU per rank
    single = render_rayjob(spec(workers=(WorkerGroup(gpus=4),)))["spec"]
    assert "--nproc" not in single["entrypoint"] and single["entrypointNumGpus"] == 1
    with pytest.raises(ValueError, match="nproc 8: .* widest worker group has 4 GPU"):
        render_rayjob(spec(workers=(WorkerGroup(gpus=4),), nproc=8))


def test_trainer_nodes_get_a_worker_group_of_their_own_that_node_0_places_them_on():
    doc = render_rayjob(spec(workers=(WorkerGroup(gpus=8, replicas=2),), nproc=8, nnodes=3))
    validate_rayjob(doc)
    assert shlex.split(doc["spec"]["entrypoint"])[-6:] == [
        "--nproc",
        "8",
        "--nnodes",
        "3",
        "--trainer-nodes",
        "ray",
    ]
    rollout, trainer = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert rollout["groupName"] == "gpu-workers" and "resources" not in rollout["rayStartParams"]
    assert (
        trainer["groupName"] == "trainer-nodes" and trainer["replicas"] == 2
    )  # nodes 1 and 2; 0: the driver's
    assert trainer["rayStartParams"] == {"num-gpus": "8", "resources": '"{\\"harnessrl_trainer_node\\": 1}"'}
    (container,) = trainer["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert trainer["template"]["spec"]["nodeSelector"] == rollout["template"]["spec"]["nodeSelector"]
    # what `ray start` gets after the shell KubeRay runs it in: the resource as JSON
    assert json.loads(shlex.split(f"--resources={trainer['rayStartParams']['resources']}")[0][12:]) == {
        "harnessrl_trainer_node": 1
    }


def test_the_committed_smoke_rayjob_validates_too():
    (doc,) = [d for d in yaml.safe_load_all((REPO / "manifests/base/rayjob-smoke.yaml").read_text()) if d]
    VALIDATOR.validate(doc)


def test_the_launcher_may_make_exactly_these_calls():
    docs = list(yaml.safe_load_all((REPO / "manifests/base/rayjob-launcher-rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    verbs = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"create", "get", "delete"} <= verbs[("ray.io", "rayjobs")]
    assert "list" in verbs[("", "pods")] and verbs[("", "pods/log")] == {"get"}
    assert role["metadata"]["namespace"] == RayJobSpec(name="x", rl_args=[]).namespace


def test_names_are_fixed_by_the_run():
    a, b = rayjob_name("run-1234"), rayjob_name("run-5678")
    assert a == rayjob_name("run-1234") and a != b and a.startswith("harnessrl-rl-") and len(a) <= 63


@pytest.fixture
def ray_api():
    servers: list[RayAPI] = []

    def make(**kw) -> RayAPI:
        servers.append(RayAPI(**kw).start())
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def _timed_sink(lines: list[tuple[float, str]]):
    return lambda line: lines.append((time.monotonic(), line))


def test_create_wait_stream_delete(ray_api):
    api = ray_api(lines=5)
    lines: list[tuple[float, str]] = []
    result = run_rayjob(spec(), api.api_client(), sink=_timed_sink(lines), poll_s=0.02)
    assert result.succeeded and result.log_lines == 5
    assert [text for _, text in lines] == [f"step {i} reward 0.{i}" for i in range(5)]
    assert api.terminal_at is not None and lines[0][0] < api.terminal_at  # streamed while the job ran
    methods = [(m, p) for m, p, _ in api.requests]
    created = next(i for i, (m, _) in enumerate(methods) if m == "POST")
    deleted = [i for i, (m, _) in enumerate(methods) if m == "DELETE"]
    assert methods[created][1] == "/apis/ray.io/v1/namespaces/harnessrl/rayjobs"
    assert len(deleted) == 1 and deleted[0] == len(methods) - 1 and not api.objects
    log_query = next(q for m, p, q in api.requests if p.endswith("/log"))
    assert log_query["follow"] == "True" and log_query["container"] == "ray-job-submitter"
    selector = next(q for m, p, q in api.requests if p.endswith("/pods"))["labelSelector"]
    assert selector == "job-name=harnessrl-rl-test"


def test_a_failed_job_raises_with_the_reason_and_is_deleted(ray_api):
    api = ray_api(final="FAILED", lines=2)
    lines: list[tuple[float, str]] = []
    with pytest.raises(RayJobFailed, match="job FAILED, deployment Failed: Job entrypoint command failed"):
        run_rayjob(spec(), api.api_client(), sink=_timed_sink(lines), poll_s=0.02)
    assert len(lines) == 2 and not api.objects


def test_a_rerun_adopts_the_running_job(ray_api):
    api = ray_api(lines=1)
    manifest = render_rayjob(spec())
    api.objects[manifest["metadata"]["name"]] = manifest  # the launcher step was retried
    result = run_rayjob(spec(), api.api_client(), sink=lambda _: None, poll_s=0.02)
    assert result.succeeded
    assert [m for m, _, _ in api.requests].count("POST") == 1 and not api.objects


def test_a_job_that_never_ends_is_deleted_at_the_timeout(ray_api):
    api = ray_api(stuck=True)
    with pytest.raises(RayJobFailed, match="not finished after"):
        run_rayjob(spec(), api.api_client(), sink=lambda _: None, poll_s=0.02, timeout_s=0.3)
    assert not api.objects and "DELETE" in [m for m, _, _ in api.requests]
