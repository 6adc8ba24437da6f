"""How `make test` spreads the suite over two worker processes (pytest-xdist: `-n 2 --dist loadfile`).

Run one test at a time, the suite kept about one of CI's 2 cores busy (32 CPU-minutes in 38 minutes besides
the benchmarks' smoke runs, measured): most tests wait on real processes — servers, sandboxes, torchrun ranks,
CLIs. Each worker takes a whole test module at a time (its tests in their order, its module fixtures built
once); the modules that start podman containers (`PODMAN_MODULES`) are one unit, run by one worker: some count
the host's containers before and after, which another module's containers would confuse. A new module that
starts containers goes into that list (tests/core/test_scheduling.py checks it). Run without `-n`, nothing
changes. A scheduler of our own (xdist's loadfile with one unit renamed) because xdist's `xdist_group` marks do
not reach its scheduler under pytest 9: xdist renames a node id to carry the group, and pytest 9 derives node
ids.
"""

from __future__ import annotations

import pytest

PODMAN_MODULES = frozenset(
    {
        "tests/benchmarks/test_smoke.py",  # benchmarks/verify.py verifies in containers
        "tests/core/test_launch_under_memory_pressure.py",
        "tests/harness/test_cli_podman.py",
        "tests/pipelines/test_container_runner.py",
        "tests/rl/test_workloads.py",
        "tests/sandbox/test_backends.py",
        "tests/sandbox/test_podman.py",
        "tests/sandbox/test_podman_attacks.py",
        "tests/sandbox/test_podman_images.py",
        "components/build_environments/tests/test_build_environments.py",
        "components/build_environments/tests/test_kfp_local.py",
    }
)


def scheduling_unit(nodeid: str) -> str:
    """The work unit a test belongs to: its module, or "podman" for the modules that start containers."""
    module = nodeid.split("::", 1)[0]
    return "podman" if module in PODMAN_MODULES else module


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own loadfile scheduler is made
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

    return ModuleScheduling(config, log)
