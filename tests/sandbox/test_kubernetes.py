"""Kubernetes backend: rendered objects against the Kubernetes schemas, and the real `kubernetes` client talking
to a local HTTP server that speaks the API's JSON (no cluster here)."""

from __future__ import annotations

import base64
import copy
import io
import json
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.cli import render_manifest_files
from harnessrl.sandbox.kubernetes import (
    KubernetesConfig,
    KubernetesSandbox,
    render_job,
    render_namespace_objects,
    render_network_policies,
)

K8S_VERSION = "1.30"
REPO = Path(__file__).resolve().parents[2]


def test_rendered_objects_validate_against_the_kubernetes_schemas():
    cfg = KubernetesConfig()
    for docs in render_namespace_objects(cfg).values():
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    broken = copy.deepcopy(render_job("x", ["true"], 10, Limits(), cfg))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_job_pod_is_locked_down():
    job = render_job(
        "verify-abc",
        ["python", "-m", "pytest"],
        42.5,
        Limits(memory_mb=512, tmp_mb=64),
        KubernetesConfig(),
        workspace_configmap="verify-abc",
    )
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (
        spec["activeDeadlineSeconds"] == 43
        and spec["backoffLimit"] == 0
        and spec["ttlSecondsAfterFinished"] > 0
    )
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"
    }
    for c in pod["containers"] + pod["initContainers"]:
        sc = c["securityContext"]
        assert (
            sc["readOnlyRootFilesystem"]
            and not sc["allowPrivilegeEscalation"]
            and sc["capabilities"] == {"drop": ["ALL"]}
        )
        assert sc["runAsUser"] != 0 and "limits" in c["resources"]
    run = pod["containers"][0]
    assert run["resources"]["limits"]["memory"] == "512Mi"
    assert {e["name"] for e in run["env"]}.isdisjoint({"AWS_SECRET_ACCESS_KEY", "KUBERNETES_SERVICE_HOST"})
    assert {v["name"]: v for v in pod["volumes"]}["tmp"]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "64Mi",
    }


def test_network_policies_deny_everything_but_the_gateway():
    deny, allow = render_network_policies(KubernetesConfig(gateway_port=9000))
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert "ingress" not in allow["spec"] and allow["spec"]["policyTypes"] == ["Egress"]
    rules = allow["spec"]["egress"]
    assert rules[0]["ports"] == [{"protocol": "TCP", "port": 9000}]
    assert rules[0]["to"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "harnessrl-gateway"}
    }
    assert {p["port"] for p in rules[1]["ports"]} == {53} and len(rules) == 2


def test_committed_manifests_are_current():
    for name, text in render_manifest_files(KubernetesConfig()).items():
        committed = REPO / "manifests" / "sandbox" / name
        assert committed.read_text() == text, (
            f"{committed} is stale: run `harnessrl sandbox manifests --out manifests/sandbox`"
        )
        list(yaml.safe_load_all(text))


class FakeAPI(BaseHTTPRequestHandler):
    """Just enough of the Kubernetes API (JSON over HTTP) for a Job's lifecycle."""

    scenario: dict = {}
    requests: list = []
    jobs: dict = {}
    polls = 0

    def _send(self, code: int, body: dict | str) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body=None):
        url = urlparse(self.path)
        FakeAPI.requests.append((self.command, url.path, parse_qs(url.query), body))
        return url

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        url = self._record(body)
        if self.scenario.get("create_status"):
            return self._send(
                self.scenario["create_status"],
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Forbidden",
                    "code": 403,
                    "message": "nope",
                },
            )
        if url.path.endswith("/jobs"):
            FakeAPI.jobs[body["metadata"]["name"]] = body
        return self._send(201, body)

    def do_GET(self):
        url = self._record()
        m = re.match(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)/status$", url.path)
        if m:
            job = copy.deepcopy(FakeAPI.jobs[m.group(2)])
            FakeAPI.polls += 1
            done = FakeAPI.polls >= 2 and self.scenario.get("condition")
            job["status"] = (
                {"conditions": [{"type": done[0], "status": "True", "reason": done[1]}]}
                if done
                else {"active": 1}
            )
            return self._send(200, job)
        if url.path.endswith("/pods"):
            name = parse_qs(url.query)["labelSelector"][0].split("=")[1]
            status: dict[str, object] = {"phase": "Failed"}
            for key, state in (
                ("containerStatuses", self.scenario.get("run")),
                ("initContainerStatuses", self.scenario.get("init")),
            ):
                if state is not None:
                    status[key] = [
                        {
                            "name": "run" if key == "containerStatuses" else "unpack-workspace",
                            "image": "img",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": state},
                        }
                    ]
            return self._send(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": [{"metadata": {"name": f"{name}-pod"}, "status": status}],
                },
            )
        if url.path.endswith("/log"):
            return self._send(200, self.scenario.get("log", ""))
        return self._send(404, {"kind": "Status", "apiVersion": "v1", "code": 404})

    def do_DELETE(self):
        self._record(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"))
        return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeAPI.requests, FakeAPI.jobs, FakeAPI.polls = [], {}, 0
    conf = client.Configuration()
    conf.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield client.ApiClient(conf)
    server.shutdown()


@pytest.mark.parametrize(
    "scenario, outcome, exit_code",
    [
        (
            {
                "condition": ("Complete", "Completed"),
                "run": {"exitCode": 0, "reason": "Completed"},
                "log": "5 passed\n",
            },
            Outcome.OK,
            0,
        ),
        (
            {
                "condition": ("Failed", "BackoffLimitExceeded"),
                "run": {"exitCode": 1, "reason": "Error"},
                "log": "1 failed\n",
            },
            Outcome.NONZERO,
            1,
        ),
        (
            {
                "condition": ("Failed", "BackoffLimitExceeded"),
                "run": {"exitCode": 137, "reason": "OOMKilled"},
            },
            Outcome.RESOURCE_LIMIT,
            137,
        ),
        ({"condition": ("Failed", "DeadlineExceeded"), "log": "collecting ..."}, Outcome.TIMEOUT, None),
        (
            {"condition": ("Failed", "BackoffLimitExceeded"), "init": {"exitCode": 2, "reason": "Error"}},
            Outcome.SANDBOX_ERROR,
            None,
        ),
        ({"create_status": 403}, Outcome.SANDBOX_ERROR, None),
        ({}, Outcome.SANDBOX_ERROR, None),  # never finishes: scheduling / image pull
    ],
    ids=["ok", "nonzero", "oom", "deadline", "init-failed", "forbidden", "stuck"],
)
def test_job_lifecycle_through_the_real_client(api, tmp_path, scenario, outcome, exit_code):
    FakeAPI.scenario = scenario
    (tmp_path / "mod.py").write_text("x = 1\n")
    cfg = KubernetesConfig(poll_s=0.01, start_grace_s=0.3)
    result = KubernetesSandbox(cfg, workspace=tmp_path, api_client=api).run(
        "pytest -q", timeout=0.2, limits=Limits(memory_mb=256)
    )
    assert (result.outcome, result.exit_code) == (outcome, exit_code), result.detail
    if outcome in (Outcome.OK, Outcome.NONZERO, Outcome.TIMEOUT):
        assert result.stdout == scenario.get("log", "")
    posts = [(p, b) for m, p, _, b in FakeAPI.requests if m == "POST"]
    assert posts[0][0] == "/api/v1/namespaces/harnessrl-sandbox/configmaps"
    tar = base64.b64decode(posts[0][1]["binaryData"]["workspace.tar.gz"])
    member = tarfile.open(fileobj=io.BytesIO(tar)).extractfile("./mod.py")
    assert member is not None and member.read() == b"x = 1\n"
    if scenario.get("create_status"):
        assert result.detail.startswith("Kubernetes API error 403")
        return
    path, job = posts[1]
    assert path == "/apis/batch/v1/namespaces/harnessrl-sandbox/jobs"
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["/bin/sh", "-c", "pytest -q"]
    name = job["metadata"]["name"]
    deletes = {p: q for m, p, q, _ in FakeAPI.requests if m == "DELETE"}
    assert deletes[f"/apis/batch/v1/namespaces/harnessrl-sandbox/jobs/{name}"]["propagationPolicy"] == [
        "Background"
    ]
    assert f"/api/v1/namespaces/harnessrl-sandbox/configmaps/{name}" in deletes
    if outcome is not Outcome.SANDBOX_ERROR or scenario.get("init"):
        selectors = [q["labelSelector"][0] for m, p, q, _ in FakeAPI.requests if p.endswith("/pods")]
        assert selectors == [f"harnessrl.io/sandbox={name}"]


def test_oversized_workspace_is_a_sandbox_error(api, tmp_path):
    import os

    (tmp_path / "big.bin").write_bytes(os.urandom(2 << 20))
    r = KubernetesSandbox(KubernetesConfig(), workspace=tmp_path, api_client=api).run(["true"], timeout=5)
    assert r.outcome is Outcome.SANDBOX_ERROR and "ConfigMap limit" in r.detail
    assert [m for m, *_ in FakeAPI.requests if m == "POST"] == []
