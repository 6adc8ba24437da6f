"""The test process's own memory across the suite: its peak resident set, the tests that raised that peak and
the tests that left the most resident memory behind, printed in pytest's terminal summary (and written as JSON
to `$HARNESSRL_TEST_MEMORY_JSON` when set); under pytest-xdist (`make test`), each worker process's. A report
for whoever reads the run, never a pass/fail: memory figures depend on the host and on what ran before.
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


@dataclass
class ProcessMemory:
    """One test process's figures: pytest's own process, or each pytest-xdist worker's (sent to the controller
    when the worker ends, printed there)."""

    name: str
    peak_resident: int
    resident_at_end: int
    tests: list[TestMemory]


_seen: list[TestMemory] = []
_workers: list[ProcessMemory] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    before, peak = resident_bytes(), peak_bytes()
    yield
    _seen.append(TestMemory(item.nodeid, before, resident_bytes(), peak_bytes() - peak))


def _this_process(name: str) -> ProcessMemory:
    return ProcessMemory(name, peak_bytes(), resident_bytes(), list(_seen))


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if output is not None:
        name = getattr(session.config, "workerinput", {}).get("workerid", "worker")
        output["memory"] = json.dumps(asdict(_this_process(name)))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    sent = getattr(node, "workeroutput", {}).get("memory")
    if sent is not None:
        data = json.loads(sent)
        tests = [TestMemory(**t) for t in data.pop("tests")]
        _workers.append(ProcessMemory(**data, tests=tests))


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def pytest_terminal_summary(terminalreporter) -> None:
    processes = sorted(_workers, key=lambda p: p.name) or ([_this_process("pytest")] if _seen else [])
    if not processes:
        return
    write = terminalreporter.write_line
    terminalreporter.section("test process memory")
    for process in processes:
        write(
            f"{process.name}: peak resident: {_gb(process.peak_resident)}; "
            f"resident at the end: {_gb(process.resident_at_end)}"
        )
        raised = sorted((t for t in process.tests if t.peak_raise >= NOTED), key=lambda t: -t.peak_raise)
        for t in raised[:SHOWN]:
            write(f"  raised the peak by {_gb(t.peak_raise)}: {t.nodeid}")
        kept = sorted(process.tests, key=lambda t: t.resident_before - t.resident_after)[:SHOWN]
        for t in kept:
            if t.resident_after - t.resident_before >= NOTED:
                write(f"  left {_gb(t.resident_after - t.resident_before)} more resident: {t.nodeid}")
    out = os.environ.get("HARNESSRL_TEST_MEMORY_JSON")
    if out:
        with open(out, "w") as f:
            json.dump({"processes": [asdict(p) for p in processes]}, f)
