"""Kubernetes backend: rendered objects against the Kubernetes schemas, and the pod sandbox driven by the real
`kubernetes` client (REST + the exec websocket) against a loopback API whose exec runs commands for real
(tests/sandbox/kube_api.py; no cluster here)."""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import tarfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.cli import render_manifest_files
from harnessrl.sandbox.kubernetes import (
    EgressAllow,
    KubernetesConfig,
    KubernetesPodSandbox,
    render_namespace_objects,
    render_network_policies,
    render_pod,
)
from harnessrl.sandbox.kubernetes_exec import OutputTooLarge, unpack_workspace
from tests.sandbox.kube_api import KubeAPI, Scenario
from tests.support.fixtures import requires_bwrap

K8S_VERSION = "1.30"
REPO = Path(__file__).resolve().parents[2]
PROXY = EgressAllow("pypi-proxy", cidrs=("10.0.0.5/32",), ports=(3128,))


def test_rendered_objects_validate_against_the_kubernetes_schemas():
    cfg = KubernetesConfig(
        egress=(PROXY, EgressAllow("mirror", namespace="infra", pod_labels={"app": "devpi"}))
    )
    for docs in render_namespace_objects(cfg).values():
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kubernetes_validate.validate(
        render_pod("p", "img:1", Limits(), cfg, network="pypi-proxy"), K8S_VERSION, strict=True
    )
    broken = copy.deepcopy(render_pod("x", "img", Limits(), cfg))
    broken["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_pod_is_locked_down():
    pod = render_pod(
        "sb-abc", "swesmith.x86_64.repo", Limits(memory_mb=512, tmp_mb=64), KubernetesConfig(), uid=1234567
    )
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"
    }
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"]
        and not sc["allowPrivilegeEscalation"]
        and sc["capabilities"] == {"drop": ["ALL"]}
    )
    assert sc["runAsUser"] == 1234567 and c["image"] == "swesmith.x86_64.repo"
    assert c["resources"]["limits"]["memory"] == "512Mi" and "ephemeral-storage" in c["resources"]["limits"]
    assert {e["name"] for e in c["env"]}.isdisjoint({"AWS_SECRET_ACCESS_KEY", "KUBERNETES_SERVICE_HOST"})
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert pod["metadata"]["labels"]["harnessrl.io/egress"] == "none"
    with pytest.raises(ValueError, match="lowercase"):
        render_pod("x", "img", Limits(), KubernetesConfig(), network="Bad Name")


def test_network_policies_deny_everything_but_the_gateway_and_named_allow_lists():
    deny, gateway, proxy = render_network_policies(KubernetesConfig(gateway_port=9000, egress=(PROXY,)))
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert "ingress" not in gateway["spec"] and gateway["spec"]["policyTypes"] == ["Egress"]
    assert gateway["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 9000}]
    assert proxy["spec"]["podSelector"] == {"matchLabels": {"harnessrl.io/egress": "pypi-proxy"}}
    rule, dns = proxy["spec"]["egress"]
    assert rule == {
        "to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
        "ports": [{"protocol": "TCP", "port": 3128}],
    }
    assert {p["port"] for p in dns["ports"]} == {53}
    with pytest.raises(ValueError, match="give cidrs or a namespace"):
        EgressAllow("empty")
    with pytest.raises(ValueError, match=r"egress\[0\]: unknown field"):
        EgressAllow.from_dict({"name": "x", "cidr": "1.2.3.4/32"}, "egress[0]")


def test_committed_manifests_are_current():
    for name, text in render_manifest_files(KubernetesConfig()).items():
        committed = REPO / "manifests" / "sandbox" / name
        assert committed.read_text() == text, (
            f"{committed} is stale: run `harnessrl sandbox manifests --out manifests/sandbox`"
        )
        list(yaml.safe_load_all(text))


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../escape.txt", "dev", "hard"], ids=["dotdot", "device", "hardlink-out"])
def test_hostile_workspace_archives_are_refused(tmp_path, name):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    info = tarfile.TarInfo(name)
    if name == "dev":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    if name == "hard":
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
    data = _tar([(tarfile.TarInfo("fine.txt"), b"x"), (info, b"evil" if info.isreg() else b"")])
    with pytest.raises(tarfile.FilterError):
        unpack_workspace(data, ws, 1 << 20)
    assert sorted(os.listdir(ws)) == ["keep.txt"] and not (tmp_path / "escape.txt").exists()


def test_workspace_archives_stay_inside_and_under_the_cap(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(OutputTooLarge):
        unpack_workspace(_tar([(tarfile.TarInfo("big"), b"y" * 2000)]), ws, 1000)
    name = f"/{tmp_path.name}-abs.txt"  # an absolute name lands inside the workspace
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"  # a symlink is only a name in the diff
    unpack_workspace(_tar([(link, b""), (tarfile.TarInfo(name), b"z")]), ws, 1 << 20)
    assert os.readlink(ws / "link") == "/etc/passwd" and (ws / name[1:]).read_text() == "z"
    assert not Path(name).exists()


@pytest.fixture
def kube():
    api = KubeAPI().start()
    yield api
    api.stop()


def _client(api: KubeAPI) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = api.base_url
    return client.ApiClient(conf)


FAST = KubernetesConfig(poll_s=0.01, pod_start_timeout_s=10.0, exec_grace_s=3.0)


@requires_bwrap
def test_a_rollout_runs_in_one_pod_through_exec(kube, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("from the host\n")
    sb = KubernetesPodSandbox(
        ws, "swesmith.x86_64.repo", Limits(memory_mb=512), cfg=FAST, api_client=_client(kube)
    )
    r = sb.run("cat a.txt; echo made-in-pod > b.txt; echo err >&2; pwd", timeout=30)
    assert (r.outcome, r.exit_code) == (Outcome.OK, 0), r
    assert r.stdout == "from the host\n/workspace\n" and r.stderr == "err\n"
    assert (ws / "b.txt").read_text() == "made-in-pod\n"  # copied back for the harness and the diff
    (ws / "c.txt").write_text("edited on the host\n")  # the harness's file tools write host-side
    r = sb.run(["cat", "c.txt"], timeout=30)
    assert r.stdout == "edited on the host\n", r
    r = sb.run("exit 3", timeout=30)
    assert (r.outcome, r.exit_code) == (Outcome.NONZERO, 3)
    r = sb.run("pwd", timeout=30, cwd="/tmp")
    assert r.stdout == "/tmp\n"
    r = sb.run("ulimit -n; ulimit -t", timeout=30, limits=Limits(open_files=64, cpu_s=7))
    assert r.stdout.split() == ["64", "7"], r
    r = sb.run("sleep 20", timeout=0.5)
    assert r.outcome is Outcome.TIMEOUT and r.wall_s < 5, r
    r = sb.run("exit 124", timeout=30)  # a command's own 124 is not our timeout
    assert (r.outcome, r.exit_code) == (Outcome.NONZERO, 124)
    r = sb.run(["sh", "-c", "head -c 3000000 /dev/zero > big.bin"], timeout=30, limits=Limits(file_size_mb=1))
    assert r.outcome is Outcome.RESOURCE_LIMIT and "SIGXFSZ" in r.detail, r
    assert (ws / "big.bin").stat().st_size == 1 << 20
    r = sb.run("no-such-program", timeout=30)
    assert (r.outcome, r.exit_code) == (Outcome.NONZERO, 127)
    assert sb.pods_started == 1 and len(kube.created) == 1
    (pod,) = kube.created
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert pod["spec"]["containers"][0]["image"] == "swesmith.x86_64.repo"
    pushes = [c for c in kube.execs if c[:3] == ["/bin/sh", "-c", c[2]] and c[3:4] == ["push"]]
    assert len(pushes) == 2  # at the start and after the host-side edit, not before every command
    execs = [q for m, p, q in kube.requests if p.endswith("/exec")]
    assert all(q["container"] == ["sandbox"] and q["tty"] == ["False"] for q in execs)
    assert [q["stdin"] == ["True"] for q in execs].count(True) == 2  # only the pushes write stdin
    name = pod["metadata"]["name"]
    sb.close()
    assert kube.deleted == [name] and not kube.pods
    sb.close()  # idempotent
    assert kube.deleted == [name]


@requires_bwrap
def test_oom_kill_reports_resource_limit_and_a_fresh_pod_takes_over(kube, tmp_path):
    kube.scenario = Scenario(oom_marker="MEMHOG")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("1\n")
    sb = KubernetesPodSandbox(ws, "img", cfg=FAST, api_client=_client(kube))
    with sb:
        assert sb.run("echo 2 > a.txt", timeout=30).ok
        r = sb.run("python -c 'MEMHOG'", timeout=30)
        assert r.outcome is Outcome.RESOURCE_LIMIT and "OOMKilled" in r.detail, r
        assert len(kube.deleted) == 1
        r = sb.run("cat a.txt", timeout=30)
        assert r.ok and r.stdout == "2\n" and sb.pods_started == 2
    assert len(kube.deleted) == 2 and not kube.pods


@pytest.mark.parametrize(
    "scenario, detail",
    [
        (Scenario(waiting_reason="ImagePullBackOff"), "did not start: ImagePullBackOff"),
        (Scenario(pending_forever=True), "not running after"),
        (Scenario(create_status=403), "Kubernetes API error 403"),
    ],
    ids=["image-pull", "never-scheduled", "forbidden"],
)
def test_pods_that_do_not_start_are_sandbox_errors_and_deleted(kube, tmp_path, scenario, detail):
    kube.scenario = scenario
    cfg = dataclasses.replace(FAST, pod_start_timeout_s=0.5)
    sb = KubernetesPodSandbox(tmp_path, "img", cfg=cfg, api_client=_client(kube))
    r = sb.run("true", timeout=5)
    assert r.outcome is Outcome.SANDBOX_ERROR and detail in r.detail, r.detail
    assert not kube.pods and kube.execs == []
    assert len(kube.deleted) == (0 if scenario.create_status else 1)


def test_unknown_network_name_is_refused(kube, tmp_path):
    cfg = KubernetesConfig(egress=(PROXY,))
    with pytest.raises(ValueError, match="not one of the configured allow-lists"):
        KubernetesPodSandbox(tmp_path, "img", network="elsewhere", cfg=cfg, api_client=_client(kube))
    sb = KubernetesPodSandbox(tmp_path, "img", network="pypi-proxy", cfg=FAST, api_client=_client(kube))
    sb.run("true", timeout=5)
    assert kube.created[0]["metadata"]["labels"]["harnessrl.io/egress"] == "pypi-proxy"
    sb.close()


@requires_bwrap
def test_verify_runs_in_a_fresh_pod_of_the_task_image(kube, tmp_path, monkeypatch, task):
    """`harnessrl verify --sandbox kubernetes`: the gold fix resolves, graded from a pod's pytest run; the
    kubeconfig is read from $KUBECONFIG as on a workstation."""
    from harnessrl.sandbox.backends import SandboxChoice
    from harnessrl.schema import SandboxKind
    from harnessrl.verify.verifier import verify_workspace

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    ws = task.workspace(tmp_path / "ws")
    task.apply_gold(ws)
    row = {**task.row, "image_name": "swesmith.x86_64.minicalc"}
    r = verify_workspace(task.taskset, row, ws, timeout_s=60, sandbox=SandboxChoice(SandboxKind.KUBERNETES))
    assert r.status == "resolved" and r.reward == 1.0, (r.detail, r.test_log[-2000:])
    assert [p["spec"]["containers"][0]["image"] for p in kube.created] == ["swesmith.x86_64.minicalc"]
    assert not kube.pods  # deleted after the run


def test_importable_inside_a_pipeline_step():
    """Steps import kfp's minimal runtime (`_KFP_RUNTIME=true`), where importing the pipeline SDK (as
    `components.common` does) breaks: the verify step on the kubernetes backend must not pull it in."""
    import subprocess
    import sys

    code = "import kfp.dsl.executor_main, harnessrl.sandbox.kubernetes, harnessrl.verify.rollouts, components.launch_rl.rayjob"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "_KFP_RUNTIME": "true"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
