"""How `make test` spreads the suite over two worker processes (pytest-xdist, `-n 2 --dist loadgroup`).

Run one test at a time, the suite kept about one of CI's 2 cores busy (32 CPU-minutes in 38 minutes besides the
benchmarks' smoke runs, measured): most tests wait on real processes — servers, sandboxes, torchrun ranks, CLIs.
Each worker takes a whole test module at a time (its tests in their order, its module fixtures built once), and
the modules that start podman containers share one worker (`PODMAN`): some count the host's containers
before and after, which another module's containers would confuse. Run without `-n`, nothing changes.
"""

from __future__ import annotations

import pytest

PODMAN = pytest.mark.xdist_group("podman")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
