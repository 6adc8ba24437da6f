"""The test process's own memory across the suite: its peak resident set, the tests that raised that peak and
the tests that left the most resident memory behind, printed in pytest's terminal summary (and written as JSON
to `$HARNESSRL_TEST_MEMORY_JSON` when set). A report for whoever reads the run, never a pass/fail: memory
figures depend on the host and on what ran before.
"""

from __future__ import annotations

import json
import os
import resource
from dataclasses import asdict, dataclass

import pytest

PAGE = os.sysconf("SC_PAGE_SIZE")
SHOWN = 5
NOTED = 10 * 2**20  # smaller moves are not worth a line


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


@dataclass
class TestMemory:
    nodeid: str
    resident_before: int
    resident_after: int
    peak_raise: int  # how far this test raised the process's high-water mark


_seen: list[TestMemory] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    before, peak = resident_bytes(), peak_bytes()
    yield
    _seen.append(TestMemory(item.nodeid, before, resident_bytes(), peak_bytes() - peak))


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seen:
        return
    peak = peak_bytes()
    write = terminalreporter.write_line
    terminalreporter.section("test process memory")
    write(f"peak resident: {_gb(peak)}; resident at the end: {_gb(resident_bytes())}")
    raised = sorted((t for t in _seen if t.peak_raise >= NOTED), key=lambda t: -t.peak_raise)[:SHOWN]
    for t in raised:
        write(f"  raised the peak by {_gb(t.peak_raise)}: {t.nodeid}")
    kept = sorted(_seen, key=lambda t: t.resident_before - t.resident_after)[:SHOWN]
    for t in kept:
        if t.resident_after - t.resident_before >= NOTED:
            write(f"  left {_gb(t.resident_after - t.resident_before)} more resident: {t.nodeid}")
    out = os.environ.get("HARNESSRL_TEST_MEMORY_JSON")
    if out:
        with open(out, "w") as f:
            json.dump({"peak_resident_bytes": peak, "tests": [asdict(t) for t in _seen]}, f)
