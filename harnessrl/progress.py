"""Progress bars: one kind (rich, on stderr) everywhere, behind one switch.

A bar shows when all of these hold, checked when it starts:
- stderr is a terminal (so never in CI logs, kfp steps or captured test output);
- logging is not quiet (`harnessrl -q`, see harnessrl.logs.is_quiet);
- HARNESSRL_PROGRESS is not "0" (`harnessrl --no-progress` sets it, so child processes follow);
- this process is not a non-zero torchrun rank (RANK): one bar per training job, not one per GPU.

Library functions take no switch of their own:

    for row in track(rows, "clean", min_total=1000):
        ...
    with ProgressBar("verify", total=len(rows)) as bar:
        bar.advance(description=f"verify: {resolved} resolved")
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Literal, TypeVar

from harnessrl.logs import is_quiet

PROGRESS_ENV = "HARNESSRL_PROGRESS"
Unit = Literal["items", "bytes"]
T = TypeVar("T")


def progress_enabled() -> bool:
    """The one switch (see the module docstring)."""
    return (
        os.environ.get(PROGRESS_ENV, "1") != "0"
        and os.environ.get("RANK", "0") == "0"
        and not is_quiet()
        and sys.stderr.isatty()
    )


class ProgressBar:
    """A bar for `total` steps (or bytes), or nothing when progress is off or the job is smaller than
    `min_total` (it would be over before the bar helped). Use it as a context manager, or start()/stop()."""

    def __init__(
        self,
        description: str,
        total: float | None = None,
        *,
        completed: int = 0,
        unit: Unit = "items",
        transient: bool = False,
        min_total: float = 0,
    ) -> None:
        self.description, self.total, self.completed = description, total, completed
        self.unit, self.transient = unit, transient
        self.shown = progress_enabled() and (total is None or total >= min_total)
        self._progress = None
        self._task = None

    def start(self) -> ProgressBar:
        if not self.shown or self._progress is not None:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        counts = (
            (DownloadColumn(), TransferSpeedColumn()) if self.unit == "bytes" else (MofNCompleteColumn(),)
        )
        self._progress = Progress(
            TextColumn("{task.description}", markup=False, style="bold"),
            BarColumn(),
            *counts,
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=self.transient,
        )
        self._task = self._progress.add_task(self.description, total=self.total, completed=self.completed)
        self._progress.start()
        return self

    def advance(self, amount: float = 1, *, description: str | None = None) -> None:
        """Moves the bar `amount` steps on (thread-safe), optionally with a new description."""
        if self._progress is None or self._task is None:
            return
        if description is None:
            self._progress.advance(self._task, amount)
        else:
            self._progress.update(self._task, advance=amount, description=description)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressBar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def track(
    items: Iterable[T], description: str, total: int | None = None, *, min_total: int = 0
) -> Iterator[T]:
    """Yields `items`, advancing a bar per item; `total` defaults to len(items) when it has one."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]  # checked just above
    with ProgressBar(description, total, min_total=min_total) as bar:
        for item in items:
            yield item
            bar.advance()
