"""`run_on`: the RL loop's engine calls on the gateway's event loop. A loop stuck in a blocking call must not
hang the run silently: past the timeout the call raises, with every thread's stack on stderr."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harnessrl.rl.learner import run_on


def test_a_stuck_loop_raises_after_the_timeout_with_the_threads_stacks(capfd):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    release = threading.Event()
    loop.call_soon_threadsafe(lambda: release.wait(30))  # something blocking inside the loop

    async def figures() -> int:
        return 7

    with pytest.raises(TimeoutError, match="did not finish an engine call in 0.2 s"):
        run_on(loop, figures(), timeout_s=0.2)
    assert "Thread" in capfd.readouterr().err  # faulthandler's dump
    release.set()
    assert run_on(loop, figures(), timeout_s=10) == 7  # the loop is free again: a call answers
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
