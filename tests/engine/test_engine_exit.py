"""A process that never closes its engine still exits cleanly: the engine's scheduler thread is stopped
before the interpreter finalizes (a daemon thread ended by CPython from inside torch aborts the process)."""

import subprocess
import sys

PROBE = """
import atexit, threading
atexit.register(lambda: print("engine threads alive at exit:",  # runs after the engine module's own hook
    sum(t.name == "harnessrl-engine" and t.is_alive() for t in threading.enumerate())))
import asyncio
from harnessrl.engine.base import SamplingParams
from harnessrl.engine.local import LocalEngine
from harnessrl.tinymodel import tiny_model_dir
engine = LocalEngine(tiny_model_dir(), max_batch=2)
generation = asyncio.run(engine.generate([1, 2, 3], SamplingParams(temperature=1.0, seed=0), max_tokens=2))
print("generated", len(generation.token_ids))
"""


def test_an_engine_left_open_is_stopped_before_the_interpreter_finalizes():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2:] == ["engine threads alive at exit: 0", ""], out.stdout + out.stderr
