"""The verify stage's attack table (tests/verify/test_attacks.py) graded on the podman backend: the same
attacks and assertions, with every test run in a fresh container of the task's environment image."""

from __future__ import annotations

import pytest

from harnessrl.sandbox.backends import SandboxChoice
from harnessrl.schema import SandboxKind
from tests.sandbox.podman_fixtures import requires_podman
from tests.support.fixtures import Task, requires_bwrap
from tests.verify.test_attacks import (  # noqa: F401 - collected here, graded by this module's fixtures
    graded,
    test_deleting_and_rewriting_test_files,
    test_exit_code_that_contradicts_the_log_is_an_infra_error,
    test_forged_summary_printed_at_exit_is_an_infra_error,
    test_gold_fix_is_resolved_and_untouched_is_not,
    test_network_access_fetching_the_fix_fails,
    test_root_conftest_forcing_passes_is_dropped,
    test_runaway_tests_are_stopped_within_limits,
    test_sitecustomize_and_pth_hooks,
    test_syntax_error_that_makes_tests_vanish,
)

pytestmark = [requires_bwrap, requires_podman, pytest.mark.slow]  # bwrap: the table's agent-side setup


@pytest.fixture(scope="module")
def attack_sandbox() -> SandboxChoice:
    return SandboxChoice(SandboxKind.PODMAN)


@pytest.fixture(scope="module")
def task(podman_task) -> Task:
    """The table's task from the task set whose rows name their environment image."""
    return podman_task
