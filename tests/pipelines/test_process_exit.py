"""Every pipeline step is a process; importing harnessrl makes its exit skip the garbage collector's final
passes over torch's and transformers' objects (gc.freeze at exit), which took ~1 s of each step."""

import subprocess
import sys

PROBE = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs after harnessrl's
import harnessrl
big = [[i] for i in range(100_000)]
"""


def test_a_process_that_imported_harnessrl_freezes_its_objects_at_exit():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "frozen at exit: True", out.stdout + out.stderr
