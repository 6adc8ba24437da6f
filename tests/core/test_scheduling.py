"""The work units `make test` gives its two workers (tests/support/scheduling.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.scheduling import PODMAN_MODULES, scheduling_unit

ROOT = Path(__file__).resolve().parents[2]
# what a module that starts podman containers uses: the container fixtures, their skip mark, podman itself
STARTS_CONTAINERS = re.compile(r"requires_podman|podman_task|env_taskset|project_image|\"podman\", \"run\"")


def test_a_module_is_one_unit_and_the_container_modules_are_one_together():
    assert scheduling_unit("tests/core/test_io.py::test_taskset_roundtrip") == "tests/core/test_io.py"
    assert (
        scheduling_unit("tests/engine/test_sampling.py::TestX::test_y[a::b]")
        == "tests/engine/test_sampling.py"
    )
    assert {scheduling_unit(f"{m}::test_x") for m in PODMAN_MODULES} == {"podman"}


def test_every_module_that_starts_containers_is_listed_and_every_listed_module_exists():
    modules = sorted(ROOT.glob("tests/**/test_*.py")) + sorted(ROOT.glob("components/*/tests/test_*.py"))
    starting = {
        str(p.relative_to(ROOT))
        for p in modules
        if p != Path(__file__) and STARTS_CONTAINERS.search(p.read_text())
    }
    assert starting, "the pattern finds no container module: update STARTS_CONTAINERS"
    assert starting <= PODMAN_MODULES, f"add to PODMAN_MODULES: {sorted(starting - PODMAN_MODULES)}"
    assert all((ROOT / m).is_file() for m in PODMAN_MODULES), [
        m for m in PODMAN_MODULES if not (ROOT / m).is_file()
    ]
