"""The container tests' fixtures (tests/sandbox/podman_fixtures.py) for every module of tests/sandbox."""

from tests.sandbox.podman_fixtures import env_taskset, podman_task, project_image  # noqa: F401
