"""Kubernetes sandbox backend: one locked-down Job per command, in the sandbox namespace.

    render_job(name, argv, timeout, limits, cfg, workspace_configmap=None) -> dict   (a batch/v1 Job)
    render_network_policies(cfg) -> [default-deny, allow-to-gateway]                 (networking.k8s.io/v1)
    KubernetesSandbox(cfg, workspace=None, api_client=None).run(cmd, timeout, limits) -> RunResult

The pod: non-root (uid 1000), read-only root filesystem, every capability dropped, no privilege escalation,
seccomp RuntimeDefault, no service-account token, no service links (so no cluster env vars), CPU/memory/
ephemeral-storage limits, `activeDeadlineSeconds` = the timeout, `backoffLimit: 0`, a TTL. The workspace is
an emptyDir filled by an init container from a tarball (a ConfigMap for small workspaces, which is what the
launcher Role in manifests/base allows); /tmp is a memory-backed emptyDir. The namespace's NetworkPolicies
deny all traffic except egress to the gateway pods (and DNS to find them).

Run: create ConfigMap + Job -> poll the Job until it completes, fails or passes its deadline -> read the run
container's log and termination state -> delete Job (+ pods) and ConfigMap. Each Job is one command, so a
workspace does not persist across calls: agent rollouts on a cluster run bubblewrap inside the rollout pod
(the same backend everywhere a rollout runs); Jobs are for verification and for harnesses that run whole episodes as one command.

Over 400 lines: rendering the Job and its policies and driving it through the API are one contract, tested
together against the Kubernetes API shapes.
"""

from __future__ import annotations

import io
import math
import re
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import IMAGE
from harnessrl.sandbox.base import WORKSPACE_MOUNT, Limits, Outcome, RunResult, Sandbox

MAX_CONFIGMAP_BYTES = 900 * 1024  # ConfigMaps hold at most 1 MiB in total
NAME_RE = re.compile(r"[^a-z0-9-]")


@dataclass(frozen=True)
class KubernetesConfig:
    namespace: str = "harnessrl-sandbox"
    image: str = IMAGE
    service_account: str = "harnessrl-sandbox"  # has no RBAC permissions; its token is not mounted anyway
    run_as_user: int = 1000
    gateway_namespace: str = "harnessrl"
    gateway_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "harnessrl-gateway"}
    )
    gateway_port: int = 8080
    ttl_seconds_after_finished: int = 600
    cpu: str = "1"
    ephemeral_storage_mb: int = 4096
    start_grace_s: float = 300.0  # image pull + scheduling, on top of the command's own timeout
    poll_s: float = 1.0


def job_name(prefix: str = "sandbox") -> str:
    return f"{NAME_RE.sub('-', prefix.lower())[:40].strip('-')}-{uuid.uuid4().hex[:10]}"


def _security_context(cfg: KubernetesConfig) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "runAsNonRoot": True,
        "runAsUser": cfg.run_as_user,
        "runAsGroup": cfg.run_as_user,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def render_job(
    name: str,
    argv: list[str],
    timeout: float,
    limits: Limits,
    cfg: KubernetesConfig,
    workspace_configmap: str | None = None,
    cwd: str = WORKSPACE_MOUNT,
) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "harnessrl-sandbox",
        "app.kubernetes.io/part-of": "harnessrl",
        "harnessrl.io/sandbox": name,
    }
    memory = f"{limits.memory_mb}Mi"
    resources = {
        "limits": {"cpu": cfg.cpu, "memory": memory, "ephemeral-storage": f"{cfg.ephemeral_storage_mb}Mi"},
        "requests": {"cpu": cfg.cpu, "memory": memory},
    }
    env = [
        {"name": k, "value": v}
        for k, v in {
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "HARNESSRL_GATEWAY_URL": f"http://harnessrl-gateway.{cfg.gateway_namespace}:{cfg.gateway_port}",
        }.items()
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "workspace", "emptyDir": {"sizeLimit": f"{cfg.ephemeral_storage_mb}Mi"}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": f"{limits.tmp_mb}Mi"}},
    ]
    init: list[dict[str, Any]] = []
    if workspace_configmap is not None:
        volumes.append({"name": "workspace-tar", "configMap": {"name": workspace_configmap}})
        init.append(
            {
                "name": "unpack-workspace",
                "image": cfg.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["tar", "-xzf", "/in/workspace.tar.gz", "-C", WORKSPACE_MOUNT],
                "securityContext": _security_context(cfg),
                "resources": {
                    "limits": {"cpu": "500m", "memory": "256Mi"},
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
                    {"name": "workspace-tar", "mountPath": "/in", "readOnly": True},
                ],
            }
        )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": cfg.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": cfg.run_as_user,
            "runAsGroup": cfg.run_as_user,
            "fsGroup": cfg.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "run",
                "image": cfg.image,
                "imagePullPolicy": "IfNotPresent",
                "command": argv,
                "workingDir": cwd,
                "env": env,
                "securityContext": _security_context(cfg),
                "resources": resources,
                "volumeMounts": [
                    {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": volumes,
    }
    if init:
        pod_spec["initContainers"] = init
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, math.ceil(timeout)),
            "ttlSecondsAfterFinished": cfg.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_network_policies(cfg: KubernetesConfig) -> list[dict[str, Any]]:
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny-all", "namespace": cfg.namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }
    allow = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "allow-egress-to-gateway", "namespace": cfg.namespace},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "harnessrl-sandbox"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": cfg.gateway_namespace}
                            },
                            "podSelector": {"matchLabels": dict(cfg.gateway_labels)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": cfg.gateway_port}],
                },
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
            ],
        },
    }
    return [deny, allow]


def render_workspace_configmap(name: str, workspace: Path, cfg: KubernetesConfig) -> dict[str, Any]:
    import base64

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(workspace, arcname=".")
    data = buf.getvalue()
    if len(data) > MAX_CONFIGMAP_BYTES:
        raise ValueError(
            f"workspace {workspace} packs to {len(data)} bytes, over the {MAX_CONFIGMAP_BYTES}-byte "
            "ConfigMap limit: run large workspaces with bubblewrap inside the step's pod"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": {"app.kubernetes.io/name": "harnessrl-sandbox", "harnessrl.io/sandbox": name},
        },
        "binaryData": {"workspace.tar.gz": base64.b64encode(data).decode("ascii")},
    }


class KubernetesSandbox(Sandbox):
    def __init__(
        self,
        cfg: KubernetesConfig | None = None,
        workspace: Path | None = None,
        api_client: Any = None,
        limits: Limits | None = None,
    ) -> None:
        self.cfg = cfg or KubernetesConfig()
        self.workspace = Path(workspace) if workspace is not None else None
        self.default_limits = limits or Limits()
        if api_client is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.api_client = api_client

    def run(
        self, cmd: list[str] | str, timeout: float, limits: Limits | None = None, cwd: str = WORKSPACE_MOUNT
    ) -> RunResult:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        limits = limits or self.default_limits
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        batch, core = client.BatchV1Api(self.api_client), client.CoreV1Api(self.api_client)
        ns, name = self.cfg.namespace, job_name()
        started = time.monotonic()
        configmap = None
        try:
            if self.workspace is not None:
                configmap = name
                core.create_namespaced_config_map(
                    ns, render_workspace_configmap(name, self.workspace, self.cfg)
                )
            batch.create_namespaced_job(ns, render_job(name, argv, timeout, limits, self.cfg, configmap, cwd))
            return self._wait(batch, core, name, timeout, started)
        except ApiException as e:
            return RunResult(
                Outcome.SANDBOX_ERROR,
                None,
                "",
                "",
                time.monotonic() - started,
                f"Kubernetes API error {e.status} {e.reason}: {(e.body or '')[:300]}",
            )
        except ValueError as e:
            return RunResult(Outcome.SANDBOX_ERROR, None, "", "", time.monotonic() - started, str(e))
        finally:
            self._cleanup(batch, core, name, configmap)

    def _wait(self, batch: Any, core: Any, name: str, timeout: float, started: float) -> RunResult:
        ns = self.cfg.namespace
        deadline = started + timeout + self.cfg.start_grace_s
        while True:
            job = batch.read_namespaced_job_status(name, ns)
            conditions = {c.type: c for c in (job.status.conditions or []) if c.status == "True"}
            if "Complete" in conditions or "Failed" in conditions or "FailureTarget" in conditions:
                break
            if time.monotonic() > deadline:
                return RunResult(
                    Outcome.SANDBOX_ERROR,
                    None,
                    "",
                    "",
                    time.monotonic() - started,
                    f"job {name} did not finish within timeout + {self.cfg.start_grace_s:g} s "
                    "(scheduling or image pull?)",
                )
            time.sleep(self.cfg.poll_s)
        wall = time.monotonic() - started
        pods = core.list_namespaced_pod(ns, label_selector=f"harnessrl.io/sandbox={name}").items
        failed = conditions.get("Failed") or conditions.get("FailureTarget")
        if failed is not None and failed.reason == "DeadlineExceeded":
            log = self._log(core, pods)
            return RunResult(
                Outcome.TIMEOUT, None, log, "", wall, f"killed at activeDeadlineSeconds={math.ceil(timeout)}"
            )
        state = None
        for pod in pods:
            for st in pod.status.init_container_statuses or []:
                term = st.state.terminated if st.state else None
                if term is not None and term.exit_code != 0:
                    return RunResult(
                        Outcome.SANDBOX_ERROR,
                        None,
                        "",
                        "",
                        wall,
                        f"init container {st.name} failed: {term.reason} (exit {term.exit_code})",
                    )
            for st in pod.status.container_statuses or []:
                if st.name == "run" and st.state and st.state.terminated:
                    state = st.state.terminated
        if state is None:
            reason = failed.reason if failed is not None else "no terminated run container"
            return RunResult(Outcome.SANDBOX_ERROR, None, "", "", wall, f"job {name} failed: {reason}")
        log = self._log(core, pods)
        if state.reason == "OOMKilled":
            return RunResult(
                Outcome.RESOURCE_LIMIT, state.exit_code, log, "", wall, "memory limit (OOMKilled)"
            )
        if state.exit_code == 0:
            return RunResult(Outcome.OK, 0, log, "", wall)
        return RunResult(Outcome.NONZERO, state.exit_code, log, "", wall, state.reason or "")

    def _log(self, core: Any, pods: list[Any]) -> str:
        from kubernetes.client.exceptions import ApiException

        for pod in pods:
            try:
                return core.read_namespaced_pod_log(pod.metadata.name, self.cfg.namespace, container="run")
            except ApiException:
                continue
        return ""

    def _cleanup(self, batch: Any, core: Any, name: str, configmap: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            batch.delete_namespaced_job(name, self.cfg.namespace, propagation_policy="Background")
        except ApiException:
            pass  # never created, or already gone (the TTL controller)
        if configmap is not None:
            try:
                core.delete_namespaced_config_map(configmap, self.cfg.namespace)
            except ApiException:
                pass


def render_namespace_objects(cfg: KubernetesConfig) -> dict[str, list[dict[str, Any]]]:
    """Everything the sandbox namespace needs, by file name under manifests/sandbox/."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": cfg.namespace,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "app.kubernetes.io/part-of": "harnessrl",
            },
        },
    }
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": cfg.service_account, "namespace": cfg.namespace},
        "automountServiceAccountToken": False,
    }
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "sandbox-quota", "namespace": cfg.namespace},
        "spec": {"hard": {"pods": "200", "limits.memory": "800Gi", "limits.cpu": "400", "configmaps": "400"}},
    }
    limit_range = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "sandbox-defaults", "namespace": cfg.namespace},
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "4Gi"},
                    "defaultRequest": {"cpu": "250m", "memory": "512Mi"},
                    "max": {"cpu": "4", "memory": "16Gi"},
                }
            ]
        },
    }
    example = render_job(
        "verify-example",
        [
            "python",
            "-P",
            "-m",
            "pytest",
            "-rA",
            "-v",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--rootdir=/workspace",
            "tests/test_example.py",
        ],
        300,
        Limits(),
        cfg,
        workspace_configmap="verify-example",
    )
    return {
        "namespace.yaml": [namespace],
        "serviceaccount.yaml": [service_account],
        "networkpolicy.yaml": render_network_policies(cfg),
        "quota.yaml": [quota, limit_range],
        "job-template.yaml": [example],
    }
