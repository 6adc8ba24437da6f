"""`harnessrl run --runner container`: kfp.local's DockerRunner against `podman system service`, each step in
the project image; the podman 4.3.1 quirk kfp trips on, and the project's narrow workaround."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet
from pipelines.local_run import Runner, run_local
from tests.sandbox.podman_fixtures import project_image, requires_podman  # noqa: F401 - a fixture

pytestmark = requires_podman
MINIREPO = Path(__file__).parents[1] / "fixtures" / "minirepo"


@pytest.fixture(scope="module")
def docker_client():
    import docker

    from pipelines.container_runner import podman_service

    images.ensure_base()
    with podman_service() as url:
        client = docker.DockerClient(base_url=url)
        yield client
        client.close()


def test_quickly_exiting_steps_report_their_real_exit_codes(docker_client, capsys):
    """The case kfp's own run_docker_container gets wrong on podman 4.3.1: a step that exits before kfp
    inspects / waits for it is being auto-removed, podman answers 500 "no such container" (Docker: 404), and
    kfp fails the step (measured: 3 of 3 `exit 3` steps). The project's runner never auto-removes."""
    from pipelines.container_runner import _run_step

    for code in (0, 3, 0, 7):
        assert (
            _run_step(docker_client, images.BASE_IMAGE, ["sh", "-c", f"exit {code}"], {}, auto_remove=True)
            == code
        )
    assert _run_step(docker_client, images.BASE_IMAGE, ["echo", "step-output"], {}) == 0
    assert "step-output" in capsys.readouterr().out
    assert not docker_client.containers.list(all=True, filters={"ancestor": images.BASE_IMAGE})


@pytest.mark.slow
@pytest.mark.usefixtures("project_image")
def test_data_prep_pipeline_with_the_container_runner(tmp_path):
    result = run_local(
        "data-prep",
        [f"source_uri={MINIREPO}", "max_tasks=2", "seed=0"],
        tmp_path / "dp",
        runner=Runner.CONTAINER,
    )
    assert result.status == "succeeded", (result.error, result.failed_log[-20:])
    index = json.loads(result.index_path.read_text())
    assert index["runner"] == "container"
    log = (tmp_path / "dp" / "run.log").read_text()
    assert (
        len(re.findall(r"step container \w+ from ghcr.io/harnessrl/harnessrl", log)) == 3
    )  # synthesize, clean, validate
    kept = TaskSet.open(index["tasks"]["clean"]["outputs"]["kept"]["path"]).rows()
    assert 1 <= len(kept) <= 2
