"""The container fixtures (tests/sandbox/podman_fixtures.py) for the CLI harnesses' podman tests."""

from tests.sandbox.podman_fixtures import env_taskset, podman_task  # noqa: F401
