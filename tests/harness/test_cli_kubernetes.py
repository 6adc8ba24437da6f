"""The real CLI agents (Claude Code, Codex: pinned, `make cli-agents`) inside a Kubernetes sandbox pod, driven through the real
Kubernetes client against the loopback API of tests/sandbox/kube_api.py: the init container copies the CLI's
prefix from the agent image into a read-only volume, the task is copied into the pod's /run/harnessrl, the
pod's second container forwards the gateway's socket, and every command runs through the exec API — the path a
cluster takes, with its stand-in kubelet running each container in bubblewrap. (What only a cluster enforces,
the NetworkPolicy that leaves the pod the gateway alone, is checked on the rendered objects in
tests/sandbox/test_kubernetes.py.)"""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import pytest
from kubernetes import client

from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.claude_code import ClaudeCodeConfig
from harnessrl.harness.codex import CodexConfig
from harnessrl.sandbox.base import Limits
from harnessrl.sandbox.kubernetes import FORWARDER, KubernetesConfig, KubernetesPodSandbox
from harnessrl.schema import RolloutStatus
from tests.harness.test_claude_code import SONNET
from tests.sandbox.kube_api import KubeAPI
from tests.support.claude_code import call, requires_claude_code
from tests.support.cli_agents import cli_rollouts
from tests.support.codex import requires_codex
from tests.support.fixtures import requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.slow]
K8S_VERSION = "1.30"
CFG = KubernetesConfig(poll_s=0.02, pod_start_timeout_s=60.0, exec_grace_s=5.0, agent_image="agents:test")


@pytest.fixture
def kube():
    api = KubeAPI().start()
    yield api
    api.stop()


CLIS = {
    "claude-code": (
        requires_claude_code,
        ClaudeCodeConfig,
        {"tools": ["Bash", "Read"], "models": SONNET},
        (
            call("Read", "Let me look.", file_path="/workspace/README.md"),
            call("Bash", command="echo fixed-in-a-pod >> README.md && ls /opt/harnessrl/claude-code"),
        ),
    ),
    "codex": (
        requires_codex,
        CodexConfig,
        {"model": "gpt-5.1-codex-max"},
        (
            call("exec_command", "Let me look.", cmd="head -3 README.md"),
            call("exec_command", cmd="echo fixed-in-a-pod >> README.md && ls /opt/harnessrl/codex"),
        ),
    ),
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=mark) for name, (mark, *_) in CLIS.items()])
def test_the_cli_runs_inside_a_pod_through_the_exec_api(name, kube, task, tokenizer, tmp_path):
    _, config, options, script = CLIS[name]
    conf = client.Configuration()
    conf.host = kube.base_url

    def pod_sandbox(workspace):
        return KubernetesPodSandbox(
            workspace, "task-image:1", Limits(), cfg=CFG, api_client=client.ApiClient(conf)
        )

    with cli_rollouts(config, task, tokenizer, tmp_path, make_sandbox=pod_sandbox) as rollout:
        r, engine = rollout((*script, "Done."))
        res = r.run(task, options)
        assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
        assert res.tool_calls == 2
        # the command ran in the pod, and the pod's workspace came back to the host
        assert (r.workspace / "README.md").read_text().endswith("fixed-in-a-pod\n")
        assert [x.op for x in r.records()] == ["new", "extend", "extend"]
        assert [x.completion_ids for x in r.records()] == engine.sampled
        (pod,) = kube.created  # one pod: the binds and the gateway came before its first command
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        spec = pod["spec"]
        (init,) = spec["initContainers"]
        assert init["image"] == "agents:test" and init["command"][:2] == ["cp", "-a"]
        assert [c["name"] for c in spec["containers"]] == ["sandbox", FORWARDER]
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts[config.mount]["readOnly"] and "/run/harnessrl" in mounts
    assert not kube.pods  # deleted when the rollout's sandbox closed


def test_a_bind_after_the_pod_started_replaces_the_pod(kube, tmp_path):
    conf = client.Configuration()
    conf.host = kube.base_url
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("kept\n")
    note = tmp_path / "note.txt"
    note.write_text("bound after the start\n")
    cfg = dataclasses.replace(CFG, agent_image="agents:test")
    sb = KubernetesPodSandbox(ws, "task-image:1", Limits(), cfg=cfg, api_client=client.ApiClient(conf))
    try:
        assert sb.run("echo one > b.txt", timeout=30).ok
        sb.bind_read_only(note, "/run/harnessrl/note.txt")
        r = sb.run("cat /run/harnessrl/note.txt a.txt b.txt", timeout=30)
        assert r.ok and r.stdout == "bound after the start\nkept\none\n", r
        assert sb.pods_started == 2 and len(kube.deleted) == 1
        with pytest.raises(Exception, match="in /run/harnessrl/ only"):
            sb.bind_read_only(note, "/etc/note.txt")
    finally:
        sb.close()
