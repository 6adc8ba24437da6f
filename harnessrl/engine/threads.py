"""Torch threads for the local engine: all of its cores while other processes leave them idle, one while they
do not.

On the shared 2-core machine (see docs/engine.md, "Threads") two OpenMP threads make prefill and decode
~1.8x faster when the second core is idle, but ~2x slower than one thread when another process keeps that
core busy (every parallel region waits for the worker that shares a core with it). So by default the engine
measures, between two steps and at most every `interval_s`, how much CPU the rest of the machine used since
the last look — every process's busy time (`/proc/stat`) minus the engine's own (its process, less the
Python threads that are not the scheduler: a gateway or harness running in the same process counts as
"others") — and uses all its cores while that stays under `up_below` cores, one thread once it exceeds
`down_above`. Where `/proc` is missing the count stays fixed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def engine_cores() -> int:
    """The cores this process may run on (its CPU affinity), at most 8."""
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:  # not Linux
        return max(1, min(8, os.cpu_count() or 1))


def _ticks(stat_line: str, first_field: int) -> int:
    """utime + stime of a /proc/<pid>[/task/<tid>]/stat line (fields 14 and 15, after the command name)."""
    fields = stat_line.rsplit(")", 1)[1].split()
    return int(fields[first_field]) + int(fields[first_field + 1])


def busy_ticks() -> tuple[int, int]:
    """(busy clock ticks of every CPU together, of the engine's threads) since boot."""
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in cpu[:8]]  # user nice system idle iowait irq softirq steal
    busy = sum(values) - values[3] - values[4]
    own = _ticks(Path("/proc/self/stat").read_text(), 11)
    scheduler = threading.get_native_id()
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or tid == scheduler:
            continue
        try:
            own -= _ticks(Path(f"/proc/self/task/{tid}/stat").read_text(), 11)
        except (OSError, IndexError, ValueError):
            continue  # the thread ended
    return busy, own


class AdaptiveThreads:
    """Call `update()` from the engine's scheduler thread between steps; it sets torch's thread count."""

    def __init__(
        self,
        max_threads: int,
        *,
        interval_s: float = 0.5,
        up_below: float = 0.35,
        down_above: float = 0.6,
        read: Callable[[], tuple[int, int]] = busy_ticks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max_threads
        self.interval_s, self.up_below, self.down_above = interval_s, up_below, down_above
        self._read, self._clock = read, clock
        self.current = 1
        self.others = 0.0  # cores the rest of the machine used in the last window
        self.switches = 0
        self._last: tuple[float, int, int] | None = None

    def update(self) -> int:
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self.current
        busy, own = self._read()
        if self._last is None:
            self._last = (now, busy, own)
            torch.set_num_threads(self.current)
            return self.current
        then, busy0, own0 = self._last
        self._last = (now, busy, own)
        self.others = max(0.0, ((busy - busy0) - (own - own0)) / _CLOCK_TICKS / max(now - then, 1e-6))
        wanted = self.current
        if self.others > self.down_above:
            wanted = 1
        elif self.others < self.up_below:
            wanted = self.max_threads
        if wanted != self.current:
            logger.debug("torch threads %d -> %d (others used %.2f cores)", self.current, wanted, self.others)
            self.current = wanted
            self.switches += 1
            torch.set_num_threads(wanted)
        return self.current
