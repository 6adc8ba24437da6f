"""Runs a pipeline locally with kfp.local (SubprocessRunner, this Python env) in a run directory:

<run dir>/run.json      index: pipeline, arguments, status, every task's status, time and outputs (path,
                        type, metrics)
<run dir>/pipeline.yaml the compiled IR that ran
<run dir>/run.log       full kfp.local log (every step's stdout/stderr)
<run dir>/artifacts/    kfp.local pipeline root: <pipeline>-<time>/<task>/<output>
<run dir>/reports/      each Markdown report (+ its plots as PNG files) and index.md
<run dir>/inputs/       local copies of s3:// / minio:// arguments (kfp.local reads only local files)

The console gets a line per step start and finish and a heartbeat for long steps, unless logging is quiet;
at debug level (`harnessrl -v run`) it gets kfp.local's whole log live instead.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.io import atomic_write_json
from harnessrl.logs import is_quiet
from pipelines.local_tasks import RunLog, TaskRecord, TaskStatus, TaskWatcher
from pipelines.run_inputs import LocalRunError, load_runnable, localize_uris, parse_arguments
from pipelines.run_outputs import task_entries, write_reports

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["LocalRunError", "RunResult", "RunStatus", "Runner", "default_run_dir", "run_local"]

logger = logging.getLogger(__name__)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
EXCEPTION_LINE_RE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Interrupt)\b.*:")


class Runner(StrEnum):
    SUBPROCESS = "subprocess"  # every step a process of this Python env (make demo)
    CONTAINER = "container"  # every step in the project image via podman (pipelines/container_runner.py)


class RunStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass
class RunResult:
    run_dir: Path
    status: RunStatus
    failed_task: str | None = None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    reports: list[Path] = field(default_factory=list)
    failed_log: list[str] = field(default_factory=list)  # the failed step's last output lines
    error: str | None = None  # kfp.local's own message when the run failed or stopped

    @property
    def failure_reason(self) -> str | None:
        """The failed step's error (the last `SomeError: ...` line of its traceback and the lines under it),
        else its last output line."""
        lines = self.failed_log
        for i in range(len(lines) - 1, -1, -1):
            if EXCEPTION_LINE_RE.match(lines[i]):
                return "\n".join(lines[i : i + 6])
        return lines[-1] if lines else None

    @property
    def index_path(self) -> Path:
        return self.run_dir / "run.json"


def default_run_dir(pipeline_name: str, root: str | Path = "runs") -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{pipeline_name}-{stamp}"


class StepLines:
    """A console line per step start and finish, and a line a minute for a step still running (its own
    output goes to run.log only)."""

    def __init__(self, console: Console, every_s: float = 60.0) -> None:
        self.console, self.every_s = console, every_s
        self.running: dict[str, float] = {}  # task name -> start (monotonic)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self) -> StepLines:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._beat.join(timeout=5)

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            for name, started in list(self.running.items()):
                if now - started >= self.every_s / 2:
                    self._print(f"    … {name} running for {now - started:.0f} s (log: run.log)")

    def launched(self, record: TaskRecord) -> None:
        self.running[record.name] = record.started
        self._print(f"  [cyan]▶[/] {record.name}")

    def finished(self, record: TaskRecord) -> None:
        self.running.pop(record.name, None)
        if record.status == TaskStatus.CACHED:
            self._print(f"  [green]✓[/] {record.name} (cached)")
        elif record.status == TaskStatus.SUCCEEDED:
            self._print(f"  [green]✓[/] {record.name} ({record.seconds:.1f} s)")
        else:
            self._print(f"  [red]✗[/] {record.name} {record.status} ({record.seconds:.1f} s)")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """`kill`/CI timeouts end the run like Ctrl-C does, so run.json still gets written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _root_logging_to(stream: io.TextIOBase) -> Iterator[None]:
    """kfp.local logs some things (cache hits, retries) at INFO outside its own logging setup: into run.log."""
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level or logging.WARNING, logging.INFO))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def run_local(
    pipeline: str,
    arguments: list[str] | Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
    *,
    cache: bool = True,
    console: Console | None = None,
    runner: Runner = Runner.SUBPROCESS,
) -> RunResult:
    """Runs `pipeline` (name or compiled YAML) with kfp.local; always writes run.json, even on failure.

    Step lines go to `console` (default: stdout) unless logging is quiet; at debug level kfp.local's log
    is echoed there live instead.
    """
    import yaml
    from kfp import compiler, local
    from rich.console import Console

    # bound to the caller's stdout now: kfp.local's output is redirected into run.log below
    console = Console(file=console.file if console is not None else sys.stdout, soft_wrap=True)
    quiet, live_log = is_quiet(), logger.isEnabledFor(logging.DEBUG)
    name, runnable = load_runnable(pipeline)
    run_dir = (Path(run_dir) if run_dir else default_run_dir(name)).resolve()
    typed = dict(arguments) if isinstance(arguments, Mapping) else parse_arguments(runnable, arguments)
    args = localize_uris(typed, inputs_dir=run_dir / "inputs")
    artifacts = run_dir / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(runnable, str(run_dir / "pipeline.yaml"))
    spec = next(yaml.safe_load_all((run_dir / "pipeline.yaml").read_text()))
    cache_root = run_dir.parent / ".kfp-cache"
    steps_runner = contextlib.ExitStack()  # the container runner's podman service, up for the whole run
    try:
        if runner is Runner.CONTAINER:
            from pipelines.container_runner import container_steps

            kfp_runner = steps_runner.enter_context(container_steps(args))
        else:
            kfp_runner = local.SubprocessRunner(use_venv=False)
        local.init(
            runner=kfp_runner,
            pipeline_root=str(artifacts),
            raise_on_error=True,
            enable_caching=cache,
            cache_root=str(cache_root) if cache else None,
        )
    except BaseException:
        steps_runner.close()
        raise
    started = dt.datetime.now(dt.UTC)
    if not quiet:
        console.print(f"[bold]{name}[/]: running locally in {run_dir}", highlight=False)
    steps = StepLines(console) if not (quiet or live_log) else None
    watcher = TaskWatcher(steps)
    status, error = RunStatus.SUCCEEDED, None
    with (
        steps_runner,
        open(run_dir / "run.log", "a", encoding="utf-8") as log,
        watcher,
        steps or contextlib.nullcontext(),
        RunLog(log, watcher, echo=console.file if live_log else None) as run_log,
        _root_logging_to(run_log),
        _sigterm_as_interrupt(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(run_log),
    ):
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        try:
            runnable(**args)
        except RuntimeError as e:  # raise_on_error: kfp.local's way of saying a step failed
            status, error = RunStatus.FAILED, ANSI_RE.sub("", str(e))
        except KeyboardInterrupt:  # keep what finished and say so; re-raised once run.json is written
            status, error = RunStatus.INTERRUPTED, "interrupted by the user"
    failed = watcher.first(TaskStatus.FAILED, TaskStatus.INTERRUPTED)
    tasks = task_entries(watcher.records, spec)
    reports = write_reports(tasks, run_dir / "reports")
    result = RunResult(
        run_dir=run_dir,
        status=status,
        failed_task=failed.name if failed else None,
        tasks=tasks,
        reports=reports,
        failed_log=failed.output_tail if failed else [],
        error=error,
    )
    run_root = watcher.run_root if watcher.run_root and watcher.run_root.is_dir() else None
    atomic_write_json(
        result.index_path,
        {
            "pipeline": name,
            "arguments": args,
            "status": str(status),
            "failed_task": result.failed_task,
            "error": result.error,
            "failed_log_tail": result.failed_log,
            "started": started.isoformat(),
            "finished": dt.datetime.now(dt.UTC).isoformat(),
            "run_dir": str(run_dir),
            "pipeline_root": str(run_root) if run_root else None,
            "log": str(run_dir / "run.log"),
            "reports": [str(p) for p in reports],
            "tasks": tasks,
            "runner": str(runner),
            "python": sys.executable,
            "cwd": os.getcwd(),
        },
    )
    if status == RunStatus.INTERRUPTED:
        raise KeyboardInterrupt(f"interrupted; partial results indexed in {result.index_path}")
    return result
