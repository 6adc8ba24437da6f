"""glibc's mmap threshold: fixed at 1 MB in every harnessrl process, raised while an optimizer step runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ,
    reason="glibc on Linux, threshold not set by the environment",
)

# In a fresh process: earlier tests leave free chunks in this one's heaps, which serve any request that fits.
PROBE = """
import ctypes, json
from harnessrl import memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped(size):  # whether malloc serves `size` bytes with a mapping of its own (hblkhd: such chunks' bytes)
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    grew = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return grew >= size

seen = {"before": mapped(4 << 20)}
with memory.large_tensors_from_the_heap():
    seen["during"], seen["during_64mb"] = mapped(4 << 20), mapped(64 << 20)
seen["after"] = mapped(4 << 20)
print(json.dumps(seen))
"""


def test_large_requests_come_from_the_heap_only_while_a_step_runs():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    # 64 MB is above glibc's largest threshold: mapped all the same
    assert json.loads(out.stdout) == {"before": True, "during": False, "during_64mb": True, "after": True}
