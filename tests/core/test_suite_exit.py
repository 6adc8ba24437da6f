"""The test process's own exit (tests/support/process_exit.py): pytest's exit status stays the process's, every
exit handler still runs, and the interpreter's finalization (where native libraries' threads crashed a
passing suite) is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import atexit
atexit.register(lambda: print("late exit handler ran", flush=True))

class Noisy:
    def __del__(self):
        print("finalized", flush=True)

kept = Noisy()
"""


@pytest.mark.parametrize(("outcome", "status"), [("pass", 0), ("fail", 1)])
def test_pytest_status_is_the_exit_status_and_handlers_run_but_finalization_does_not(
    tmp_path, outcome, status
):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    assert {outcome == 'pass'}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.process_exit", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == status, out.stdout + out.stderr
    assert "late exit handler ran" in out.stdout, out.stdout
    assert "finalized" not in out.stdout, out.stdout
