from pathlib import Path

import pytest

from tests.rl.support import small_policy, write_prompt_tasks
from tests.sandbox.podman_fixtures import env_taskset, podman_task  # noqa: F401 - for test_workloads.py


@pytest.fixture(scope="session")
def rl_policy(tmp_path_factory) -> Path:
    """A 4-layer cut of the tiny model (read-only)."""
    return small_policy(tmp_path_factory.mktemp("rl-policy") / "policy")


@pytest.fixture(scope="session")
def prompt_tasks(tmp_path_factory) -> Path:
    return write_prompt_tasks(tmp_path_factory.mktemp("rl-tasks") / "tasks.jsonl")
