"""Freed memory goes back to the system.

glibc's malloc serves a large request with its own mapping, but after such a mapping is freed it raises that
threshold to the freed size (up to 32 MB), so the next tensors of up to 32 MB come from the heap. A training
step allocates and frees gigabytes of such tensors (activations, logits, gradients) between long-lived small
objects, and the heap cannot shrink past the live ones: a trainer step of the tiny model left its process 5.6 GB
above what it held alive, and the next step grew it again (docs/train.md, "Memory"). A fixed threshold keeps
every request of `MMAP_THRESHOLD_BYTES` or more in a mapping of its own, returned to the system when freed.

Set once per process when `harnessrl` is imported (every stage, pipeline step, trainer rank and test process
imports it). `MALLOC_MMAP_THRESHOLD_` in the environment wins, as glibc documents.

Smaller tensors (the prefix cache's blocks, a decode step's) stay in malloc's heaps, one per thread that
allocates; `trim()` hands their free pages back after a phase that freed many of them (an optimizer step, a
weight sync that flushes the prefix cache): a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def return_freed_memory() -> bool:
    """True when glibc took the fixed threshold; False elsewhere (not Linux/glibc, or set by the environment)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # another C library
        return False


def trim() -> None:
    """malloc_trim(0): every heap's free pages back to the system (no-op where it is not glibc)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
