"""Fixtures of the container tests (tests/sandbox/test_podman*.py, tests/pipelines/test_container_runner.py):
import the ones a module uses. Every test that needs podman skips with the reason when it cannot run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet
from tests.support.fixtures import Task

PODMAN_PROBLEM = images.podman_problem()
requires_podman = pytest.mark.skipif(PODMAN_PROBLEM is not None, reason=f"podman: {PODMAN_PROBLEM}")


@pytest.fixture(scope="session")
def env_taskset(synth_taskset, tmp_path_factory) -> Path:
    """The synthesized task set after the build_environments stage: every row names its environment image."""
    from components.build_environments.stage import run_build_environments

    if PODMAN_PROBLEM is not None:
        pytest.skip(f"podman: {PODMAN_PROBLEM}")
    out = tmp_path_factory.mktemp("envs") / "out"
    run_build_environments(synth_taskset, out)
    return out / "tasks"


@pytest.fixture(scope="session")
def podman_task(env_taskset) -> Task:
    """The conftest `task` (the same row), from the task set with images."""
    rows = TaskSet.open(env_taskset).rows()
    rows.sort(key=lambda r: -len(r["FAIL_TO_PASS"]))
    return Task(TaskSet.open(env_taskset), rows[0])


@pytest.fixture(scope="session")
def project_image() -> str:
    """The cpu project image, built (podman's layer cache: seconds when only sources changed)."""
    if PODMAN_PROBLEM is not None:
        pytest.skip(f"podman: {PODMAN_PROBLEM}")
    return images.build_project()
