"""The test process ends once pytest is done with it: after every exit handler, before the interpreter's
finalization (module teardown, then native libraries' static destructors).

By the session's end this one process has hosted Ray drivers, gRPC clients, torch engines, moto and gateway
servers, and their native threads are still there when the libraries' destructors run (measured at the end
of a full run: Ray's GCS client I/O thread, gRPC's timer and event-engine threads, 34 idle executor threads).
One full CI run in five crashed there (SIGSEGV, in a native thread, after "1627 passed"), turning a passing
suite into exit 2. What a product process does at its own exit is tested in processes of its own
(tests/engine/test_engine_exit.py, tests/pipelines/test_process_exit.py)."""

from __future__ import annotations

import atexit
import os
import sys

import pytest

_outer: list[pytest.Config] = []  # the session this process runs (not a pytester session run inside it)
_status: list[int] = []


def _end_now() -> None:
    if _status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_status[0])


# registered when pytest loads its plugins: handlers registered later (by what the tests import) run first
atexit.register(_end_now)


def pytest_configure(config: pytest.Config) -> None:
    if not _outer:
        _outer.append(config)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session):
    yield
    if _outer and session.config is _outer[0]:
        _status[:] = [int(session.exitstatus)]
