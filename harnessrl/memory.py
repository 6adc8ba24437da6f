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

A mapping of its own costs a page fault, and a page the kernel must zero, for every 4 kB the tensor touches,
every time: an optimizer step of the Claude Code demo's shape (32 sequences, ~2,800 tokens) spent 20% of its
CPU time in the kernel at the 1 MB threshold. `large_tensors_from_the_heap()` raises the threshold to glibc's
own maximum while a step runs and trims after it: three steps took 23-27 s instead of 28-31 s (kernel time
40 -> 16 CPU-s), ~0.9 GB more at their peak (4.2 -> 5.1 GB), the same 2.1 GB left after the trim.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

MMAP_THRESHOLD_BYTES = 1 << 20
STEP_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def _set_mmap_threshold(size: int) -> bool:
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):  # another C library
        return False


def return_freed_memory() -> bool:
    """True when glibc took the fixed threshold; False elsewhere (not Linux/glibc, or set by the environment)."""
    return _set_mmap_threshold(MMAP_THRESHOLD_BYTES)


@contextlib.contextmanager
def large_tensors_from_the_heap() -> Iterator[None]:
    """Requests of up to 32 MB come from malloc's heaps while open (no page faults on reused memory); after
    it, the fixed threshold again and the heaps' free pages back to the system. No-op where the threshold is
    not ours to set."""
    raised = _set_mmap_threshold(STEP_MMAP_THRESHOLD_BYTES)
    try:
        yield
    finally:
        if raised:
            _set_mmap_threshold(MMAP_THRESHOLD_BYTES)
        trim()


def trim() -> None:
    """malloc_trim(0): every heap's free pages back to the system (no-op where it is not glibc)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
