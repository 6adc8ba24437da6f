"""Snapshots of what the agent produced, taken after each of its tool calls (environments.base.Episode.snapshots).

`SnapshotRuntime` wraps the episode's ToolRuntime: after every command and every file write it asks the
environment's `produced` hook for the current product (the kernel environment: the text of solution.py, one
file read) and keeps it when it differs from every snapshot kept so far — at most `keep` of them, the latest.
Reads pass straight through. A product that cannot be taken right then (over its cap, unreadable) is skipped:
the final product, taken after the episode, still decides whether the rollout is `patch_too_large`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harness.runtime import MAX_EDIT_BYTES, FileView, ShellResult, ToolRuntime

logger = logging.getLogger(__name__)


class SnapshotRuntime:
    def __init__(self, inner: ToolRuntime, take: Callable[[], str], keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.inner = inner
        self.take = take
        self.keep = keep
        self.workspace: Path = inner.workspace
        self.snapshots: list[str] = []  # distinct products, oldest first

    def __getattr__(self, name: str) -> Any:  # sandbox, limits, ...: what harnesses that look for them find
        return getattr(self.inner, name)

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        try:
            return self.inner.run_shell(command, timeout)
        finally:
            self._snapshot()

    def write_file(self, path: str, content: str) -> None:
        try:
            self.inner.write_file(path, content)
        finally:
            self._snapshot()

    def read_file(self, path: str, max_bytes: int = MAX_EDIT_BYTES) -> str:
        return self.inner.read_file(path, max_bytes)

    def view_file(self, path: str, first: int = 1, last: int | None = None) -> FileView:
        return self.inner.view_file(path, first, last)

    def _snapshot(self) -> None:
        from harnessrl.sandbox.workspace import PatchTooLarge

        try:
            product = self.take()
        except (PatchTooLarge, OSError) as e:
            logger.debug("no snapshot after this tool call: %s", e)
            return
        if product in self.snapshots:
            return
        self.snapshots.append(product)
        del self.snapshots[: -self.keep]
