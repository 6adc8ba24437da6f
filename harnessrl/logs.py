"""Logging for the whole project, configured once per process.

Libraries only do `logger = logging.getLogger(__name__)`. Each process's entry point calls
`configure_logging` once: the `harnessrl` CLI with the level of its `-v`/`-q` flags, a pipeline component
(a process of its own under kfp.local or on a cluster) with no argument, which takes the level from
HARNESSRL_LOG_LEVEL (default INFO).

Our own packages log at the chosen level. Other libraries (kfp, urllib3, httpx, ray, ...) reach the
terminal only from `others` up (default WARNING): at INFO some of them print a line per HTTP request.
A console handler someone installed before (KFP's executor runs `logging.basicConfig` to stdout before a
component's code) is replaced, so every record is printed once, in one format.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_LEVEL_ENV = "HARNESSRL_LOG_LEVEL"
PACKAGES = ("harnessrl", "components", "dataprep", "pipelines")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


def _writes_to_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return stream is not None and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted: pytest's capture and rich's live progress
    display replace it, and a handler bound to the old stream would write past them."""

    def __init__(self, others: int) -> None:
        super().__init__()
        self.others = others

    @property
    def stream(self):  # type: ignore[override]  # a read-only view of sys.stderr
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.split(".", 1)[0] in PACKAGES
        return (ours or record.levelno >= self.others) and bool(super().filter(record))


def parse_level(level: int | str) -> int:
    """A logging level from a number or a name (case-insensitive); a clear error for anything else."""
    if isinstance(level, int):
        return level
    name = level.strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)} (e.g. {LOG_LEVEL_ENV}=INFO)")
    return logging.getLevelNamesMapping()[name]


def configure_logging(level: int | str | None = None, *, others: int | str = logging.WARNING) -> int:
    """Sends log records to stderr in a compact format (`12:00:01 I dataprep.clean: kept 3 of 4`).

    `level` applies to our packages (default: HARNESSRL_LOG_LEVEL, else INFO), `others` to every other
    library. Calling it again replaces the earlier setup. Returns the level in effect for our packages.
    """
    chosen = parse_level(level if level is not None else os.environ.get(LOG_LEVEL_ENV) or "INFO")
    other = parse_level(others)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler) or _writes_to_console(h)]:
        root.removeHandler(handler)
    handler = _StderrHandler(other)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(other)
    # a library that set its own logger's level (the kubernetes client sets urllib3's to WARNING when its
    # Configuration is made) would not follow `others`: the application decides, so those levels go
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".", 1)[0] not in PACKAGES:
            logger.setLevel(logging.NOTSET)
    for package in PACKAGES:
        logging.getLogger(package).setLevel(chosen)
    return chosen


def is_quiet() -> bool:
    """True when our packages do not log at INFO: `harnessrl -q`, or a process that never configured
    logging (Python's default is WARNING). Progress bars and step lines stay off then."""
    return not logging.getLogger(PACKAGES[0]).isEnabledFor(logging.INFO)
