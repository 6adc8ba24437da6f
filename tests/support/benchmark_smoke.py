"""The benchmarks' smoke runs (tests/benchmarks/test_smoke.py) start in the background as soon as the suite is
collected, and their tests run last.

A smoke run is mostly one core's work, and the rest of the suite leaves about half of 2 cores idle (a full run on
2 cores, smoke runs first and two at a time: 62 CPU-minutes in 53 minutes, both cores busy for the smoke runs'
13): one run at a time beside the suite uses that idle core, instead of holding the suite while two run. When the smoke tests
are reached, the rest of the queue runs two at a time, and the scripts kept from running beside the suite
(test_smoke.AFTER_THE_SUITE: they start podman containers, which podman tests count) start."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

SMOKE_FILE = "tests/benchmarks/test_smoke.py"
BESIDE_THE_SUITE = 1  # runs at a time while other tests run
AT_THE_END = 2  # once the smoke tests are reached

Run = Future[subprocess.CompletedProcess[str]]


class SmokePool:
    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self._pool = ThreadPoolExecutor(AT_THE_END, thread_name_prefix="smoke")
        self._slots = threading.Semaphore(BESIDE_THE_SUITE)
        self._widened = False

    def start(self, names: list[str], smoke: Callable[[str], subprocess.CompletedProcess[str]]) -> None:
        def gated(name: str) -> subprocess.CompletedProcess[str]:
            with self._slots:
                return smoke(name)

        self.runs.update({name: self._pool.submit(gated, name) for name in names if name not in self.runs})

    def widen(self) -> None:
        """The suite's other tests are done: the queue runs AT_THE_END at a time."""
        if not self._widened:
            self._widened = True
            for _ in range(AT_THE_END - BESIDE_THE_SUITE):
                self._slots.release()

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


POOL = SmokePool()


def _is_smoke(item: pytest.Item) -> bool:
    return item.nodeid.startswith(SMOKE_FILE + "::test_smoke_run_ends_with_its_headline_json")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    smoke = [i for i in items if _is_smoke(i)]
    items[:] = [i for i in items if not _is_smoke(i)] + smoke


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    names = [
        str(i.callspec.params["name"])
        for i in session.items
        if _is_smoke(i) and isinstance(i, pytest.Function)
    ]
    if names:
        from tests.benchmarks.test_smoke import runnable_smoke_runs, smoke_run

        POOL.start(runnable_smoke_runs(names, beside_the_suite=True), smoke_run)


def pytest_sessionfinish() -> None:
    POOL.stop()
