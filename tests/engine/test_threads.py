"""Adaptive torch threads: all cores while the rest of the machine is idle, one while it is busy."""

import pytest
import torch

from harnessrl.engine.threads import _CLOCK_TICKS, AdaptiveThreads, busy_ticks


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Machine:
    """Feeds AdaptiveThreads readings: every `advance` adds `others` cores of foreign work and `own` cores of
    the engine's for `seconds`."""

    def __init__(self) -> None:
        self.now, self.busy, self.own = 0.0, 0, 0

    def advance(self, seconds: float, others: float, own: float = 1.0) -> None:
        self.now += seconds
        self.own += int(own * seconds * _CLOCK_TICKS)
        self.busy += int((own + others) * seconds * _CLOCK_TICKS)


def test_uses_all_cores_when_idle_and_one_when_others_are_busy_with_hysteresis():
    m = Machine()
    gov = AdaptiveThreads(2, interval_s=0.5, read=lambda: (m.busy, m.own), clock=lambda: m.now)
    assert gov.update() == 1  # first look: nothing measured yet, start safe
    m.advance(1.0, others=0.05)
    assert gov.update() == 2 and torch.get_num_threads() == 2
    m.advance(0.2, others=1.0)
    assert gov.update() == 2  # within the interval: no new look
    m.advance(1.0, others=1.0)
    assert gov.update() == 1 and torch.get_num_threads() == 1 and gov.others == pytest.approx(1.0, abs=0.05)
    m.advance(1.0, others=0.5)  # between the thresholds: stays
    assert gov.update() == 1
    m.advance(1.0, others=0.1)
    assert gov.update() == 2 and gov.switches == 3


def test_busy_ticks_reads_this_machine():
    busy, own = busy_ticks()
    assert busy > 0 and 0 <= own <= busy


def test_the_engine_adapts_its_threads_by_default(engine, chat):
    from tests.engine.support import GREEDY, run

    run(engine.generate(chat("hi"), GREEDY, 2))
    stats = engine.snapshot().figures
    assert stats["adaptive_threads"] is True and 1 <= stats["threads"] <= 8
