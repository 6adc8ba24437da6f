"""Sandbox selection: `make_sandbox` per kind, specs naming podman / kubernetes, verify on a chosen backend."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.backends import SandboxChoice, make_sandbox, needs_env
from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.schema import SandboxKind
from tests.support.fixtures import requires_bwrap

PODMAN_MODULE = importlib.util.find_spec("harnessrl.sandbox.podman") is not None


@requires_bwrap
def test_bubblewrap_is_built_as_before(tmp_path):
    from harnessrl.sandbox.bwrap import BubblewrapSandbox

    (tmp_path / "a.txt").write_text("hello\n")
    with make_sandbox(
        SandboxKind.BUBBLEWRAP, tmp_path, env_dir=None, image=None, limits=Limits(memory_mb=512)
    ) as sb:
        assert isinstance(sb, BubblewrapSandbox) and sb.default_limits.memory_mb == 512
        r = sb.run("cat a.txt; id -u; echo x > b.txt", timeout=30)
    assert r.outcome is Outcome.OK and r.stdout.split() == ["hello", "1000"], r
    assert (tmp_path / "b.txt").read_text() == "x\n"


@pytest.mark.parametrize("kind", [SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT])
def test_bubblewrap_has_no_network_to_name(tmp_path, kind):
    with pytest.raises(ValueError, match="has no network"):
        make_sandbox(kind, tmp_path, env_dir=None, image=None, limits=Limits(), network="pypi-proxy")


@pytest.mark.parametrize("kind", [SandboxKind.PODMAN, SandboxKind.KUBERNETES])
def test_container_backends_need_an_image(tmp_path, kind):
    with pytest.raises(ValueError, match="give the task an image_name"):
        make_sandbox(kind, tmp_path, env_dir=None, image=None, limits=Limits())


def test_local_is_not_a_backend(tmp_path):
    with pytest.raises(ValueError, match="not a sandbox backend"):
        make_sandbox(SandboxKind.LOCAL, tmp_path, env_dir=None, image=None, limits=Limits())
    with pytest.raises(ValueError, match="verify needs a sandbox backend"):
        SandboxChoice(SandboxKind.LOCAL)


def test_podman_missing_module_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "harnessrl.sandbox.podman", None)  # an install without the module
    with pytest.raises(ValueError) as e:
        make_sandbox(SandboxKind.PODMAN, tmp_path, env_dir=None, image="img", limits=Limits())
    assert "\n" not in str(e.value) and "harnessrl/sandbox/podman.py" in str(e.value)


@pytest.mark.skipif(
    not PODMAN_MODULE or shutil.which("podman") is None,
    reason="needs harnessrl/sandbox/podman.py and a podman binary",
)
def test_podman_is_selected_and_runs(tmp_path):
    from harnessrl.sandbox.images import BASE_IMAGE as image  # pyright: ignore[reportMissingImports]

    if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode != 0:
        pytest.skip(f"podman has no image {image} (the podman tests build it)")
    (tmp_path / "a.txt").write_text("from the host\n")
    with make_sandbox(SandboxKind.PODMAN, tmp_path, env_dir=None, image=image, limits=Limits()) as sb:
        assert type(sb).__name__ == "PodmanSandbox"
        r = sb.run("cat a.txt", timeout=60)
    assert r.outcome is Outcome.OK and r.stdout == "from the host\n", r


def test_needs_env_only_for_bubblewrap():
    assert [k for k in SandboxKind if needs_env(k)] == [SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT]


def test_specs_accept_container_backends_and_their_network():
    specs = parse_specs(
        [{"sandbox": "kubernetes", "network": "pypi-proxy"}, {"sandbox": "podman"}, {}], "specs.json"
    )
    assert [(s.spec.sandbox, s.spec.network) for s in specs] == [
        (SandboxKind.KUBERNETES, "pypi-proxy"),
        (SandboxKind.PODMAN, None),
        (SandboxKind.BUBBLEWRAP, None),
    ]
    with pytest.raises(ValueError, match=r"specs.json\[0\].network: only sandbox podman or kubernetes"):
        parse_specs([{"network": "pypi-proxy"}], "specs.json")
    with pytest.raises(ValueError, match=r"specs.json\[0\].sandbox must be one of .*kubernetes"):
        parse_specs([{"sandbox": "docker"}], "specs.json")


def test_generate_refuses_container_specs_for_tasks_without_an_image(synth_taskset, tmp_path):
    from harnessrl.io import read_jsonl, write_jsonl
    from harnessrl.rollout.generate import GenerateConfig, run_generate

    tasks = tmp_path / "tasks"
    shutil.copytree(synth_taskset, tasks)
    rows = [{k: v for k, v in r.items() if k != "image_name"} for r in read_jsonl(tasks / "tasks.jsonl")]
    write_jsonl(tasks / "tasks.jsonl", rows)
    specs = parse_specs({"sandbox": "kubernetes"})
    with pytest.raises(
        ValueError, match=r"spec .*: sandbox kubernetes runs the task's image_name, and it has none"
    ):
        run_generate(tasks, tmp_path / "out", specs, config=GenerateConfig(group_size=1, max_tasks=1))
    assert not (tmp_path / "out").exists()


def test_verify_on_a_container_backend_without_an_image_is_an_infra_error(task):
    from harnessrl.verify.grading import VerifyStatus
    from harnessrl.verify.verifier import verify_patch
    from tests.support.patches import NO_FIX

    row = {k: v for k, v in task.row.items() if k != "image_name"}
    r = verify_patch(task.taskset, row, NO_FIX, sandbox=SandboxChoice(SandboxKind.KUBERNETES))
    assert r.status is VerifyStatus.INFRA_ERROR and "give the task an image_name" in r.detail, r.detail


def test_verify_choice_refuses_a_network_without_containers():
    with pytest.raises(ValueError, match="--network needs podman or kubernetes"):
        SandboxChoice(SandboxKind.BUBBLEWRAP, "proxy")


@pytest.fixture
def kube_env(tmp_path, monkeypatch):
    """A loopback Kubernetes API reached the way a workstation reaches a cluster: through $KUBECONFIG."""
    from tests.sandbox.kube_api import KubeAPI

    api = KubeAPI().start()
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield api
    api.stop()


@requires_bwrap
def test_kubernetes_is_selected_and_runs_through_the_api(kube_env, tmp_path):
    from harnessrl.sandbox.kubernetes import KubernetesPodSandbox

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    with make_sandbox(
        SandboxKind.KUBERNETES,
        ws,
        env_dir=None,
        image="task:1",
        limits=Limits(memory_mb=256),
        network="proxy",
    ) as sb:
        assert isinstance(sb, KubernetesPodSandbox)
        r = sb.run("cat a.txt", timeout=30)
    assert r.outcome is Outcome.OK and r.stdout == "hello\n", r
    (pod,) = kube_env.created
    assert pod["metadata"]["labels"]["harnessrl.io/egress"] == "proxy"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "256Mi"
    assert kube_env.deleted == [pod["metadata"]["name"]]


@requires_bwrap
def test_a_rollout_on_the_kubernetes_backend(kube_env, synth_taskset, fast_engine, tmp_path):
    """generate with a kubernetes spec: one pod per rollout from the task's image_name, the harness's edit made
    on the host reaches the pod, the pod's writes come back into the diff, the pod is deleted at the end."""
    import json

    from harnessrl.io import read_jsonl
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource

    def call(name: str, **arguments: str) -> dict:
        return {"text": f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"}

    engine = fast_engine(
        [
            call(
                "str_replace_editor", command="create", path="NOTES.md", file_text="edited by the harness\n"
            ),
            call("bash", command="cat NOTES.md > COPY.md && echo pod-uid=$(id -u)"),
            call("submit"),
        ]
    )
    out = tmp_path / "gen"
    run_generate(
        synth_taskset,
        out,
        parse_specs({"sandbox": "kubernetes", "limits": {"turns": 4}}),
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=1, max_tasks=1),
    )
    (row,) = read_jsonl(out / "rollouts.jsonl")
    assert row["rollout_status"] == "ok" and row["finish_reason"] == "submitted", row["error"]
    assert "+++ b/COPY.md" in row["model_patch"] and "+edited by the harness" in row["model_patch"]
    (pod,) = kube_env.created
    task = next(
        t for t in read_jsonl(synth_taskset / "tasks.jsonl") if t["instance_id"] == row["instance_id"]
    )
    assert pod["spec"]["containers"][0]["image"] == task["image_name"]
    assert kube_env.deleted == [pod["metadata"]["name"]] and not kube_env.pods
