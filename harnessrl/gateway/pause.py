"""Pause / drain / abort / resume for weight updates.

Paused: new calls get 429 + Retry-After, or, with `hold_new`, wait until resume (a harness just sees a slow
call: what the RL loop's colocated mode needs, since a training step can outlast any harness's retries). `finish` waits until the calls at work are committed; `abort` also
stops in-flight generations — through the engine's abort when it has one (the partial tokens come back with
finish_reason "abort" and are kept), else by cancelling the engine request — and parks those calls until
resume, when they continue from the tokens sampled so far. A parked call is not "at work", so the drain ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from harnessrl.engine.base import Engine, EngineError

from .enums import PauseMode
from .metrics import GatewayMetrics

logger = logging.getLogger(__name__)


class PauseControl:
    def __init__(self, engine: Engine, metrics: GatewayMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.paused = False
        self.hold_new = False  # paused: new calls wait for resume instead of getting 429
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight: set[asyncio.Future[Any]] = set()  # engine requests
        self._working: set[asyncio.Task[Any]] = set()  # calls generating or committing (not parked)
        self._aborting: set[asyncio.Future[Any]] = set()

    @property
    def working(self) -> int:
        return len(self._working)

    def set_working(self, task: asyncio.Task[Any], working: bool) -> None:
        if working:
            self._working.add(task)
            self._idle.clear()
        else:
            self._working.discard(task)
            if not self._working:
                self._idle.set()

    async def wait_resumed(self, task: asyncio.Task[Any]) -> None:
        """Parks a call while an aborting pause lasts (it is not part of the drain meanwhile)."""
        if self._resumed.is_set():
            return
        self.set_working(task, False)
        await self._resumed.wait()
        self.set_working(task, True)

    async def hold_while_paused(self) -> bool:
        """Waits out a holding pause before a new call starts (the call is not at work meanwhile, so it does
        not delay the drain); True if it waited."""
        if not (self.paused and self.hold_new):
            return False
        self.metrics.held_paused += 1
        while self.paused and self.hold_new:
            await self._resumed.wait()
        return True

    def track(self, request: asyncio.Future[Any]) -> None:
        self.in_flight.add(request)

    def untrack(self, request: asyncio.Future[Any]) -> bool:
        """Forgets an engine request; True if a pause cancelled it (generate again after resume)."""
        self.in_flight.discard(request)
        aborted = request in self._aborting
        self._aborting.discard(request)
        return aborted

    async def pause(self, mode: PauseMode, timeout_s: float, hold_new: bool = False) -> dict[str, Any]:
        """Pauses, then waits up to `timeout_s` for the drain. If pausing fails, the gateway is not left
        paused (a pause whose waiting admin client leaves stays: it is resumed with `resume`)."""
        self.paused = True
        self.hold_new = hold_new
        self._resumed.clear()
        try:
            if mode is PauseMode.ABORT and self.in_flight:
                if (
                    not await self._engine_abort()
                ):  # no engine-side abort: cancel; generated again after resume
                    for request in list(self.in_flight):
                        self._aborting.add(request)
                        request.cancel()
                        self.metrics.aborted_generations += 1
            drained = True
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                drained = False
        except Exception:
            self.resume()
            raise
        return {"paused": True, "drained": drained, "in_flight": self.working}

    async def _engine_abort(self) -> bool:
        """Engine-side abort (ours: the partial tokens come back with finish_reason "abort" and are kept)."""
        try:
            return await self.engine.abort()
        except EngineError as e:
            logger.info("engine abort failed (%s); cancelling the in-flight requests instead", e)
            return False  # e.g. vLLM has no /abort endpoint

    def resume(self) -> None:
        self.paused = False
        self.hold_new = False
        self._resumed.set()
