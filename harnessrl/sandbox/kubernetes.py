"""Kubernetes sandbox backend: one locked-down pod per rollout (or per verification) from the task's image,
commands through the exec API.

    KubernetesPodSandbox(workspace, image, limits, network=None, *, cfg=None, api_client=None)
        .run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult;  .close() deletes the pod
    render_pod(name, image, limits, cfg, network=None, uid=..., workspace_mb=...) -> dict      (a v1 Pod)
    render_network_policies(cfg) -> [default-deny, allow-to-gateway, one per EgressAllow]      (networking/v1)
    render_namespace_objects(cfg) -> {file name: [objects]}                                   (manifests/sandbox)

The pod: non-root (a uid of its own per pod, so RLIMIT_NPROC counts only its processes), read-only root
filesystem (`cfg.read_only_root`), every capability dropped, no privilege escalation, seccomp RuntimeDefault,
no service-account token, no service links, CPU / memory / ephemeral-storage limits, an `activeDeadlineSeconds`
that ends a pod nobody deleted; `/workspace` and `/tmp` are emptyDirs. Its container idles; each command is
one exec of `sh -c` that sets ulimits (CPU seconds, file size, open files, processes), changes into `cwd` and
runs the command under `timeout`.

The workspace stays a directory on the host (the harness edits files there and the framework diffs it): before
a command it is copied into the pod when it changed on the host (tar over the exec's stdin), after a command
it is copied back (tar over stdout, unpacked with tarfile's `data` filter: the pod is hostile). A pod that was
lost (OOM kill of the container, client-side deadline) is deleted; the next command gets a fresh pod from the
host copy. Network: the namespace denies everything; a pod labelled `harnessrl.io/egress=<network>` gets what
the NetworkPolicy of that name allows (`EgressAllow`, rendered into manifests/sandbox per task set); without a
matching policy the label opens nothing.

A whole agent (a production CLI: harness/cli_episode.py) runs inside the pod as under bubblewrap and podman
(`AgentSandbox`): a directory it binds (the CLI's install prefix) is copied by an init container from the agent
image (`cfg.agent_image`: the project image built with the pinned CLIs at the same paths the rollout worker
has them) into a volume mounted read-only at the bind's place; a file it binds (the task, the loopback
bridge) goes into the `/run/harnessrl` volume after the pod starts; the gateway is reached through a Unix
socket in that volume, served by a second container of the agent image (`python -m harnessrl.sandbox.forward`)
that forwards it to the gateway's address (the namespace's policy lets the pod reach the gateway and nothing
else). A bind or the gateway added after the pod started replaces the pod before the next command (a pod's
spec cannot change; the workspace is the host's copy, so nothing is lost).

Over 400 lines: the pod, its policies and driving it through the API are one contract, tested together
against the Kubernetes API shapes.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.cluster import IMAGE
from harnessrl.sandbox.base import (
    GATEWAY_SOCKET_MOUNT,
    WORKSPACE_MOUNT,
    AgentSandbox,
    Limits,
    Outcome,
    RunResult,
    SandboxError,
    checked_bind,
)
from harnessrl.sandbox.kubernetes_exec import (
    ExecResult,
    OutputTooLarge,
    exec_in_pod,
    fingerprint,
    pack_files,
    pack_workspace,
    unpack_workspace,
)

logger = logging.getLogger(__name__)
NAME_RE = re.compile(r"[^a-z0-9-]")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CONTAINER = "sandbox"
MiB = 1 << 20
MAX_OUTPUT = 2 * MiB  # per stream and command, head + tail (as the bubblewrap backend)
UID_BASE, UID_SLOTS = 1_200_000_000, 1_000_000
AGENT_DIR = str(Path(GATEWAY_SOCKET_MOUNT).parent)  # /run/harnessrl: the gateway's socket and the bound files
FORWARDER = "gateway-forwarder"
ULIMIT_FAILED = 125
ULIMIT_MARKER = "harnessrl-sandbox: setting limits failed"
# cd, ulimits (-u is bash's process limit, -p dash's), then the command under timeout (exit 124 at the limit).
RUN_SCRIPT = (
    'cd "$1" || exit 126; '
    f'{{ ulimit -t "$2" && ulimit -f "$3" && ulimit -n "$4" && {{ ulimit -u "$5" 2>/dev/null || ulimit -p "$5"; }}; }} '
    f'|| {{ echo "{ULIMIT_MARKER}" >&2; exit {ULIMIT_FAILED}; }}; '
    't="$6"; shift 6; exec timeout -k 2 "$t" "$@"'
)
PUSH_SCRIPT = (
    'find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf {} + && head -c "$2" | tar -xzf - -C "$1" --no-same-owner'
)
START_FAILURES = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


@dataclass(frozen=True)
class EgressAllow:
    """A named egress allow-list: pods labelled `harnessrl.io/egress=<name>` may reach these, nothing else.
    `cidrs` (e.g. a package-index proxy's address) and/or pods with `pod_labels` in `namespace`, on TCP
    `ports` (every port when empty)."""

    name: str
    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    namespace: str | None = None
    pod_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not LABEL_VALUE_RE.match(self.name):
            raise ValueError(f"egress allow-list name {self.name!r}: use lowercase letters, digits and '-'")
        if not self.cidrs and self.namespace is None:
            raise ValueError(f"egress allow-list {self.name!r}: give cidrs or a namespace (+ pod_labels)")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> EgressAllow:
        allowed = {"name", "cidrs", "ports", "namespace", "pod_labels"}
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        try:
            return cls(
                str(d["name"]),
                tuple(d.get("cidrs", ())),
                tuple(int(p) for p in d.get("ports", ())),
                d.get("namespace"),
                dict(d.get("pod_labels", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


def load_egress(path: Path) -> tuple[EgressAllow, ...]:
    """A task set's allow-lists from a JSON file: a list of EgressAllow objects."""
    import json

    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read egress allow-lists ({e})") from None
    if not isinstance(raw, list) or not all(isinstance(d, dict) for d in raw):
        raise ValueError(
            f"{path}: expected a JSON list of objects {{name, cidrs, ports, namespace, pod_labels}}"
        )
    return tuple(EgressAllow.from_dict(d, f"{path}[{i}]") for i, d in enumerate(raw))


@dataclass(frozen=True)
class KubernetesConfig:
    namespace: str = "harnessrl-sandbox"
    image: str = IMAGE  # for the example manifest only: pods run the task's image
    service_account: str = "harnessrl-sandbox"  # has no RBAC permissions; its token is not mounted anyway
    run_as_user: int | None = None  # None: a uid of its own per pod (UID_BASE + random slot)
    read_only_root: bool = True  # images that write outside /workspace and /tmp need False
    gateway_namespace: str = "harnessrl"
    gateway_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "harnessrl-gateway"}
    )
    gateway_port: int = 8080
    egress: tuple[EgressAllow, ...] = ()
    cpu: str = "1"
    ephemeral_storage_mb: int = 4096
    pod_start_timeout_s: float = 300.0  # scheduling + image pull
    max_pod_s: int = 6 * 3600  # activeDeadlineSeconds: a pod nobody deleted ends here
    exec_grace_s: float = 15.0  # past the command's own timeout, the client gives up and deletes the pod
    poll_s: float = 1.0
    idle_command: tuple[str, ...] = ("sleep", "infinity")
    # the image an agent's directories are copied from and its gateway forwarder runs in: the project image
    # with the pinned CLIs (`python -m harnessrl.sandbox.images project --with-cli-agents`)
    agent_image: str = f"{IMAGE}-agents"

    @classmethod
    def from_env(cls) -> KubernetesConfig:
        """`HARNESSRL_SANDBOX_NAMESPACE` moves the namespace (the rollout/verify pods run where RBAC lets them);
        `HARNESSRL_SANDBOX_AGENT_IMAGE` names the agent image."""
        return cls(
            namespace=os.environ.get("HARNESSRL_SANDBOX_NAMESPACE", cls.namespace),
            agent_image=os.environ.get("HARNESSRL_SANDBOX_AGENT_IMAGE", cls.agent_image),
        )


@dataclass(frozen=True)
class PodAgent:
    """What an agent running inside the pod adds to it (see the module docstring): `dirs` (path in the agent
    image, path inside the sandbox) copied into read-only volumes, and the gateway URL its forwarder serves."""

    image: str
    dirs: tuple[tuple[str, str], ...] = ()
    gateway_url: str | None = None


def pod_name(prefix: str = "sandbox") -> str:
    return f"{NAME_RE.sub('-', prefix.lower())[:40].strip('-')}-{uuid.uuid4().hex[:10]}"


def _security_context(uid: int, read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "privileged": False,
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_labels(name: str, network: str | None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "harnessrl-sandbox",
        "app.kubernetes.io/part-of": "harnessrl",
        "harnessrl.io/sandbox": name,
        "harnessrl.io/egress": network or "none",
    }


def render_pod(
    name: str,
    image: str,
    limits: Limits,
    cfg: KubernetesConfig,
    network: str | None = None,
    uid: int = UID_BASE,
    workspace_mb: int | None = None,
    agent: PodAgent | None = None,
) -> dict[str, Any]:
    """The sandbox pod. `workspace_mb`: the workspace emptyDir's size limit (default: limits.workspace_mb);
    `agent`: what an agent running inside adds (volumes, the init containers that fill them, the forwarder)."""
    if network is not None and not LABEL_VALUE_RE.match(network):
        raise ValueError(f"network {network!r}: an egress allow-list name is lowercase letters, digits, '-'")
    memory = f"{limits.memory_mb}Mi"
    ws_mb = workspace_mb or limits.workspace_mb
    storage = f"{max(cfg.ephemeral_storage_mb, ws_mb + 64)}Mi"
    env = {
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": pod_labels(name, network)},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": cfg.max_pod_s,
            "serviceAccountName": cfg.service_account,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": uid,
                "runAsGroup": uid,
                "fsGroup": uid,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": list(cfg.idle_command),
                    "workingDir": WORKSPACE_MOUNT,
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "securityContext": _security_context(uid, cfg.read_only_root),
                    "resources": {
                        "limits": {"cpu": cfg.cpu, "memory": memory, "ephemeral-storage": storage},
                        "requests": {"cpu": cfg.cpu, "memory": memory, "ephemeral-storage": storage},
                    },
                    "volumeMounts": [
                        {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                {"name": "workspace", "emptyDir": {"sizeLimit": f"{ws_mb}Mi"}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": f"{limits.tmp_mb}Mi"}},
            ],
        },
    }
    if agent is not None:
        _add_agent(pod["spec"], agent, uid, cfg.read_only_root)
    return pod


def _add_agent(spec: dict[str, Any], agent: PodAgent, uid: int, read_only_root: bool) -> None:
    small = {"cpu": "100m", "memory": "128Mi"}
    sandbox = spec["containers"][0]
    run = {"name": "agent-run", "mountPath": AGENT_DIR}
    spec["volumes"].append({"name": "agent-run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}})
    sandbox["volumeMounts"].append(run)
    for i, (source, inside) in enumerate(agent.dirs):
        volume = f"agent-dir-{i}"
        spec["volumes"].append({"name": volume, "emptyDir": {}})
        sandbox["volumeMounts"].append({"name": volume, "mountPath": inside, "readOnly": True})
        spec.setdefault("initContainers", []).append(
            {
                "name": f"copy-{i}",
                "image": agent.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["cp", "-a", f"{source.rstrip('/')}/.", "/into/"],
                "securityContext": _security_context(uid, True),
                "resources": {"limits": {**small, "memory": "512Mi"}, "requests": small},
                "volumeMounts": [{"name": volume, "mountPath": "/into"}],
            }
        )
    if agent.gateway_url is not None:
        forward = ["python", "-m", "harnessrl.sandbox.forward", "--socket", GATEWAY_SOCKET_MOUNT]
        spec["containers"].append(
            {
                "name": FORWARDER,
                "image": agent.image,
                "imagePullPolicy": "IfNotPresent",
                "command": [*forward, "--to", agent.gateway_url],
                "securityContext": _security_context(uid, read_only_root),
                "resources": {"limits": small, "requests": small},
                "volumeMounts": [run],
            }
        )


def _dns_rule() -> dict[str, Any]:
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


def render_egress_policy(allow: EgressAllow, cfg: KubernetesConfig) -> dict[str, Any]:
    peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": c}} for c in allow.cidrs]
    if allow.namespace is not None:
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": allow.namespace}},
                "podSelector": {"matchLabels": dict(allow.pod_labels)},
            }
        )
    rule: dict[str, Any] = {"to": peers}
    if allow.ports:
        rule["ports"] = [{"protocol": "TCP", "port": p} for p in allow.ports]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"allow-egress-{allow.name}", "namespace": cfg.namespace},
        "spec": {
            "podSelector": {"matchLabels": {"harnessrl.io/egress": allow.name}},
            "policyTypes": ["Egress"],
            "egress": [rule, _dns_rule()],
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
                _dns_rule(),
            ],
        },
    }
    return [deny, allow, *(render_egress_policy(a, cfg) for a in cfg.egress)]


class KubernetesPodSandbox(AgentSandbox):
    """One pod for the sandbox's lifetime; see the module docstring. Memory and storage are the pod's (fixed
    when it starts, from `limits`); the other limits apply per command."""

    def __init__(
        self,
        workspace: Path,
        image: str,
        limits: Limits | None = None,
        network: str | None = None,
        *,
        cfg: KubernetesConfig | None = None,
        api_client: Any = None,
    ) -> None:
        self.cfg = cfg or KubernetesConfig.from_env()
        self.workspace = Path(workspace)
        self.image, self.network = image, network
        self.default_limits = limits or Limits()
        if network is not None and not LABEL_VALUE_RE.match(network):
            raise ValueError(
                f"network {network!r}: an egress allow-list name is lowercase letters, digits, '-'"
            )
        known = {a.name for a in self.cfg.egress}
        if network is not None and known and network not in known:
            raise ValueError(f"network {network!r} is not one of the configured allow-lists {sorted(known)}")
        if api_client is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:  # outside a pod: $KUBECONFIG (read now) or ~/.kube/config
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
            api_client = client.ApiClient()
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)  # the client's return types are unions of every shape
        self.pod: str | None = None
        self.pods_started = 0
        self._synced: int | None = None  # fingerprint of the host workspace as the pod has it
        self._base_bytes = 0
        self._oom_kills = 0
        self._finalizer: weakref.finalize | None = None
        self.agent_dirs: list[tuple[str, str]] = []  # bind_read_only: (directory, path inside)
        self.agent_files: list[tuple[Path, str]] = []  # bind_read_only: (file, path inside, in AGENT_DIR)
        self.gateway_url: str | None = None

    # -- what an agent that runs inside adds --------------------------------------------------------------
    def bind_read_only(self, host: Path, inside: str) -> None:
        """A directory: copied from the agent image's same path by an init container into a volume the
        sandbox mounts read-only. A file (small: the task, a script): copied into AGENT_DIR when the pod
        starts; the pod's uid could change that copy, which is why files go there only (nothing of the host
        reads them back)."""
        host = checked_bind(host, inside)
        if host.is_dir():
            self.agent_dirs.append((str(host), inside))
        elif Path(inside).parent != Path(AGENT_DIR):
            raise SandboxError(f"a pod takes bound files in {AGENT_DIR}/ only, not at {inside!r}")
        else:
            self.agent_files.append((host, inside))
        self._drop_pod()  # the next command gets a pod with it

    def connect_gateway(self, url: str) -> str:
        if self.gateway_url is not None:
            raise SandboxError(f"this sandbox already reaches a gateway ({self.gateway_url})")
        if not url.startswith("http://"):
            raise SandboxError(f"the gateway URL must be http://host:port/..., got {url!r}")
        self.gateway_url = url
        self._drop_pod()
        return GATEWAY_SOCKET_MOUNT

    def _agent(self) -> PodAgent | None:
        if not (self.agent_dirs or self.agent_files or self.gateway_url):
            return None
        return PodAgent(self.cfg.agent_image, tuple(self.agent_dirs), self.gateway_url)

    # -- pod lifecycle ------------------------------------------------------------------------------------
    def _start(self) -> str | None:
        """Creates the pod and waits until it runs; returns why not (the pod is deleted again)."""
        from kubernetes.client.exceptions import ApiException

        name = pod_name()
        self._base_bytes = sum(f.stat().st_size for f in self.workspace.rglob("*") if f.is_file())
        ws_mb = math.ceil(self._base_bytes / MiB) + self.default_limits.workspace_mb
        uid = self.cfg.run_as_user or UID_BASE + secrets.randbelow(UID_SLOTS)
        manifest = render_pod(
            name, self.image, self.default_limits, self.cfg, self.network, uid, ws_mb, self._agent()
        )
        try:
            self.core.create_namespaced_pod(self.cfg.namespace, manifest)
        except ApiException as e:
            return f"creating pod: Kubernetes API error {e.status} {e.reason}: {(e.body or '')[:300]}"
        self.pod, self.pods_started, self._synced, self._oom_kills = name, self.pods_started + 1, None, 0
        self._finalizer = weakref.finalize(self, _delete_pod, self.core, name, self.cfg.namespace)
        deadline = time.monotonic() + self.cfg.pod_start_timeout_s
        while True:
            try:
                pod = self.core.read_namespaced_pod(name, self.cfg.namespace)
            except ApiException as e:
                why = f"reading pod {name}: Kubernetes API error {e.status} {e.reason}"
                break
            phase = pod.status.phase if pod.status else None
            waiting = [
                s.state.waiting.reason
                for s in (pod.status.container_statuses or [] if pod.status else [])
                if s.state and s.state.waiting and s.state.waiting.reason in START_FAILURES
            ]
            if phase == "Running":
                why = self._push_agent_files()
                if why is None:
                    return None
                break
            if waiting or phase in ("Failed", "Succeeded"):
                why = f"pod {name} did not start: {waiting[0] if waiting else phase}"
                break
            if time.monotonic() > deadline:
                why = (
                    f"pod {name} not running after {self.cfg.pod_start_timeout_s:g} s "
                    "(scheduling or image pull?)"
                )
                break
            time.sleep(self.cfg.poll_s)
        self._drop_pod()
        return why

    def _drop_pod(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # deletes the pod once
        self.pod, self._finalizer, self._synced = None, None, None

    def close(self) -> None:
        """Deletes the pod (the host workspace stays)."""
        self._drop_pod()

    # -- commands -----------------------------------------------------------------------------------------
    def _exec(self, argv: list[str], deadline: float, **kw: Any) -> ExecResult:
        assert self.pod is not None
        return exec_in_pod(
            self.core,
            self.pod,
            self.cfg.namespace,
            CONTAINER,
            argv,
            deadline=deadline,
            max_output=MAX_OUTPUT,
            **kw,
        )

    def _push_agent_files(self) -> str | None:
        """The bound files into AGENT_DIR (their modes kept), or why not."""
        if not self.agent_files:
            return None
        data = pack_files({inside.rsplit("/", 1)[1]: host for host, inside in self.agent_files})
        argv = ["/bin/sh", "-c", 'head -c "$2" | tar -xzf - -C "$1" --no-same-owner', "push", AGENT_DIR]
        r = self._exec([*argv, str(len(data))], time.monotonic() + 60, stdin=data)
        if r.exit_code != 0:
            why = r.error or r.stderr.decode(errors="replace")[-300:]
            return f"copying the bound files into pod {self.pod}: {why}"
        return None

    def _push(self) -> str | None:
        data = pack_workspace(self.workspace)
        argv = ["/bin/sh", "-c", PUSH_SCRIPT, "push", WORKSPACE_MOUNT, str(len(data))]
        r = self._exec(argv, time.monotonic() + 60 + len(data) / MiB, stdin=data)
        if r.exit_code != 0:
            return f"copying the workspace into pod {self.pod}: {r.error or r.stderr.decode(errors='replace')[-300:]}"
        self._synced = fingerprint(self.workspace)
        return None

    def _pull(self) -> tuple[Outcome, str] | None:
        """Copies the pod's workspace back; (outcome, why) when that fails."""
        cap = self._base_bytes + self.default_limits.workspace_mb * MiB
        try:
            r = self._exec(
                ["tar", "-czf", "-", "-C", WORKSPACE_MOUNT, "."],
                time.monotonic() + 60 + cap / (50 * MiB),
                whole_stdout=True,
            )
            if r.exit_code != 0:
                why = r.error or r.stderr.decode(errors="replace")[-300:]
                return Outcome.SANDBOX_ERROR, f"copying the workspace out of pod {self.pod}: {why}"
            unpack_workspace(r.stdout, self.workspace, cap)
        except OutputTooLarge as e:
            return (
                Outcome.RESOURCE_LIMIT,
                f"workspace quota: {e} (limit {self.default_limits.workspace_mb} MB growth)",
            )
        except Exception as e:  # tarfile's filter refused a member, a broken archive
            return Outcome.SANDBOX_ERROR, f"workspace from pod {self.pod} refused: {type(e).__name__}: {e}"
        self._synced = fingerprint(self.workspace)
        return None

    def _oom_killed(self) -> bool:
        """Whether the kernel OOM-killed something in the pod since the last look (cgroup v2 memory.events),
        or the container itself died OOMKilled."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.core.read_namespaced_pod(self.pod, self.cfg.namespace)
            for s in (pod.status.container_statuses or []) if pod.status else []:
                if s.state and s.state.terminated and s.state.terminated.reason == "OOMKilled":
                    return True
        except ApiException:
            return False
        r = self._exec(["cat", "/sys/fs/cgroup/memory.events"], time.monotonic() + 30)
        counts = dict(line.split() for line in r.stdout.decode(errors="replace").splitlines() if " " in line)
        kills = int(counts.get("oom_kill", "0") or 0)
        seen, self._oom_kills = self._oom_kills, kills
        return kills > seen

    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """`env`: variables for this run only, on top of the pod's (a harness's settings and key)."""
        limits = limits or self.default_limits
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        started = time.monotonic()

        def fail(
            outcome: Outcome, detail: str, code: int | None = None, out: str = "", err: str = ""
        ) -> RunResult:
            return RunResult(outcome, code, out, err, time.monotonic() - started, detail)

        if self.pod is None:
            why = self._start()
            if why is not None:
                return fail(Outcome.SANDBOX_ERROR, why)
        if self._synced != fingerprint(self.workspace):
            why = self._push()
            if why is not None:
                self._drop_pod()
                return fail(Outcome.SANDBOX_ERROR, why)
        wrapped = [
            "/bin/sh",
            "-c",
            RUN_SCRIPT,
            "harnessrl-run",
            cwd,
            str(limits.cpu_s),
            str(limits.file_size_mb * 2048),  # 512-byte blocks (POSIX sh)
            str(limits.open_files),
            str(limits.processes),
            f"{max(timeout, 0.001):.3f}",
            *argv,
        ]
        t0 = time.monotonic()
        r = self._exec(wrapped, t0 + timeout + self.cfg.exec_grace_s)
        wall = time.monotonic() - t0
        out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
        if r.timed_out:
            self._drop_pod()
            return RunResult(
                Outcome.TIMEOUT,
                None,
                out,
                err,
                wall,
                f"no answer {self.cfg.exec_grace_s:g} s past the timeout; pod deleted",
            )
        if r.exit_code is None:  # the exec broke: find out whether the container died of memory
            oom = self._oom_killed()
            self._drop_pod()
            if oom:
                return RunResult(
                    Outcome.RESOURCE_LIMIT, None, out, err, wall, "memory limit (OOMKilled); pod replaced"
                )
            return RunResult(Outcome.SANDBOX_ERROR, None, out, err, wall, r.error)
        code = r.exit_code
        if code == ULIMIT_FAILED and ULIMIT_MARKER in err:
            return RunResult(Outcome.SANDBOX_ERROR, None, out, err, wall, ULIMIT_MARKER)
        if code in (124, 137) and wall >= timeout:  # `timeout` fired (a command's own 124 is quicker)
            outcome, detail = Outcome.TIMEOUT, f"killed at the {timeout:g} s timeout"
        elif code == 137 and self._oom_killed():
            outcome, detail = Outcome.RESOURCE_LIMIT, "memory limit (OOM kill)"
        elif code in (128 + 24, 128 + 25):  # SIGXCPU, SIGXFSZ
            outcome = Outcome.RESOURCE_LIMIT
            detail = "CPU time limit (SIGXCPU)" if code == 152 else "file size limit (SIGXFSZ)"
        else:
            outcome, detail = (Outcome.OK, "") if code == 0 else (Outcome.NONZERO, "")
        failed = self._pull()
        if failed is not None:
            if failed[0] is Outcome.SANDBOX_ERROR:
                self._drop_pod()
            return RunResult(failed[0], code, out, err, wall, failed[1])
        return RunResult(outcome, code, out, err, wall, detail)


def _delete_pod(core: Any, name: str, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException:
        pass  # already gone (deadline, eviction) or never admitted
    except Exception as e:  # at interpreter exit the API may be unreachable: activeDeadlineSeconds ends it
        logger.warning("deleting sandbox pod %s/%s failed: %s", namespace, name, e)


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
        "spec": {"hard": {"pods": "200", "limits.memory": "800Gi", "limits.cpu": "400"}},
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
    example = render_pod("sandbox-example", cfg.image, Limits(), cfg, uid=UID_BASE)
    return {
        "namespace.yaml": [namespace],
        "serviceaccount.yaml": [service_account],
        "networkpolicy.yaml": render_network_policies(cfg),
        "quota.yaml": [quota, limit_range],
        "pod-template.yaml": [example],
    }
