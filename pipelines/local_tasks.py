"""What kfp.local did in a run, task by task, as records instead of log text.

kfp.local has no event interface, but it runs every task through a few module-level functions, looked up at
call time. `TaskWatcher` wraps them for the length of a run, observing without changing what they do:

- `task_executor.execute_single_task`: every task of a pipeline (both of kfp.local's orchestrators, plain
  DAGs and DAGs with control flow, call it): name, start, end, status, and outputs as kfp returns them
  (artifacts with URI and metadata, parameter values), for cached tasks too;
- `task_dispatcher.run_single_task`: the same for a compiled YAML that holds a single component;
- `LocalCache.get`: whether a task's outputs came from kfp.local's cache;
- `task_dispatcher.run_single_task_implementation`: a step process is starting, and where its outputs go;
- `subprocess_task_handler.run_local_subprocess`: which printed lines are the step's own output (kfp prints
  them from the step's process), so a failed step's error comes from its output, not kfp's framing.

kfp is pinned (kfp==2.17.*); should a release rename these, the run stops at once with a LocalRunError.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Protocol

from pipelines.run_inputs import LocalRunError


class TaskStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    CACHED = "cached"  # outputs reused from the kfp.local cache (they live in the run that computed them)
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM while it ran


@dataclass
class TaskRecord:
    name: str  # the task's name in the pipeline, e.g. "train-grpo-2"
    component: str  # its component's name in the compiled spec, e.g. "comp-train-grpo-2"
    task_root: Path | None = None  # where kfp.local puts this step's outputs in this run
    started: float = field(default_factory=time.monotonic)
    status: TaskStatus = TaskStatus.RUNNING
    seconds: float = 0.0
    outputs: dict[str, Any] = field(default_factory=dict)  # kfp's values: dsl.Artifact or parameter values
    output: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # the step's own last lines
    launched: bool = False  # a step process was started (not cached, not an importer)

    @property
    def output_tail(self) -> list[str]:
        return [line.strip() for line in self.output if line.strip()][-40:]


class TaskListener(Protocol):
    def launched(self, record: TaskRecord) -> None: ...

    def finished(self, record: TaskRecord) -> None: ...


class TaskWatcher:
    """Records every task kfp.local runs while it is entered (see the module docstring)."""

    def __init__(self, listener: TaskListener | None = None) -> None:
        self.listener = listener
        self.records: list[TaskRecord] = []
        self.run_root: Path | None = None  # <pipeline root>/<pipeline>-<time>: this run's task outputs
        self._current = threading.local()  # kfp runs parallel tasks in threads, each task in one thread
        self._lock = threading.Lock()
        self._restore: list[Callable[[], None]] = []

    def _patch(
        self,
        owner: Any,
        name: str,
        make: Callable[[Callable[..., Any]], Callable[..., Any]],
        parameters: tuple[str, ...] = (),
    ) -> None:
        original = getattr(owner, name, None)
        if original is None or not set(parameters) <= set(inspect.signature(original).parameters):
            import kfp

            raise LocalRunError(
                f"kfp {kfp.__version__}: {owner.__name__}.{name} is gone or takes other parameters than "
                f"{parameters}; harnessrl's local runner follows kfp.local 2.17 (pyproject pins kfp==2.17.*)"
            )
        setattr(owner, name, functools.wraps(original)(make(original)))
        self._restore.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> TaskWatcher:
        from kfp.local import cache, subprocess_task_handler, task_dispatcher
        from kfp.local.orchestrator import task_executor

        try:
            self._patch(
                task_executor,
                "execute_single_task",
                self._wrap_execute,
                ("task_name", "task_spec"),
            )
            self._patch(task_dispatcher, "run_single_task", self._wrap_single, ("pipeline_spec",))
            self._patch(
                task_dispatcher,
                "run_single_task_implementation",
                self._wrap_step,
                ("pipeline_resource_name", "component_name", "pipeline_root"),
            )
            self._patch(cache.LocalCache, "get", self._wrap_cache_get)
            self._patch(subprocess_task_handler, "run_local_subprocess", self._wrap_subprocess)
        except LocalRunError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        while self._restore:
            self._restore.pop()()

    def first(self, *statuses: TaskStatus) -> TaskRecord | None:
        return next((r for r in self.records if r.status in statuses), None)

    def step_line(self, line: str) -> None:
        """A line kfp printed; kept with its task when it is that task's step output."""
        record = getattr(self._current, "record", None)
        if record is not None and getattr(self._current, "in_step", False):
            record.output.append(line)

    @contextlib.contextmanager
    def _task(self, name: str, component: str) -> Iterator[TaskRecord]:
        """One task from start to end, in this thread; its status on an exception, the listener told."""
        record = TaskRecord(name, component)
        with self._lock:
            self.records.append(record)
        self._current.record = record
        try:
            yield record
        except BaseException as e:
            record.status = TaskStatus.INTERRUPTED if isinstance(e, KeyboardInterrupt) else TaskStatus.FAILED
            raise
        finally:
            record.seconds = time.monotonic() - record.started
            self._current.record = None
            if self.listener is not None:
                self.listener.finished(record)

    @staticmethod
    def _done(record: TaskRecord, outputs: dict[str, Any]) -> None:
        record.status = TaskStatus.CACHED if record.status == TaskStatus.CACHED else TaskStatus.SUCCEEDED
        record.outputs = dict(outputs)

    def _wrap_execute(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from kfp.local import status

        signature = inspect.signature(original)

        def execute(*args: Any, **kwargs: Any) -> Any:
            call = signature.bind(*args, **kwargs).arguments
            with self._task(call["task_name"], call["task_spec"].component_ref.name) as record:
                outputs, task_status = original(*args, **kwargs)
                if task_status == status.Status.SUCCESS:
                    self._done(record, outputs)
                else:
                    record.status = TaskStatus.FAILED
                return outputs, task_status

        return execute

    def _wrap_single(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from kfp.local import executor_input_utils as paths

        signature = inspect.signature(original)

        def run_single(*args: Any, **kwargs: Any) -> Any:
            component = next(iter(signature.bind(*args, **kwargs).arguments["pipeline_spec"].components))
            with self._task(paths.get_local_task_resource_name(component), component) as record:
                outputs = original(*args, **kwargs)  # a failure raises (local.init(raise_on_error=True))
                self._done(record, outputs)
                return outputs

        return run_single

    def _wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from kfp.local import executor_input_utils as paths

        signature = inspect.signature(original)

        def run_step(*args: Any, **kwargs: Any) -> Any:
            record = getattr(self._current, "record", None)
            if record is not None:
                call = signature.bind(*args, **kwargs).arguments
                run_root = Path(call["pipeline_root"]) / call["pipeline_resource_name"]
                record.task_root = run_root / paths.get_local_task_resource_name(call["component_name"])
                with self._lock:
                    self.run_root = self.run_root or run_root
                if not record.launched:
                    record.launched = True
                    if self.listener is not None:
                        self.listener.launched(record)
            return original(*args, **kwargs)

        return run_step

    def _wrap_cache_get(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def get(cache: Any, key: str) -> Any:
            found = original(cache, key)
            record = getattr(self._current, "record", None)
            if found is not None and record is not None:
                record.status = TaskStatus.CACHED
            return found

        return get

    def _wrap_subprocess(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def run_process(*args: Any, **kwargs: Any) -> Any:
            self._current.in_step = True
            try:
                return original(*args, **kwargs)
            finally:
                self._current.in_step = False

        return run_process


class RunLog(io.TextIOBase):
    """What kfp.local prints (its log and every step's output): all of it into run.log, optionally live
    to a terminal too, and each complete line to the watcher, which keeps a step's lines with its task."""

    def __init__(self, log: IO[str], watcher: TaskWatcher, echo: IO[str] | None = None) -> None:
        self.log, self.watcher, self.echo = log, watcher, echo
        self._partial = threading.local()  # kfp writes a line in pieces (indent, then text)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        if self.echo is not None:
            self.echo.write(text)
        *lines, rest = (getattr(self._partial, "text", "") + text).split("\n")
        self._partial.text = rest
        for line in lines:
            self.watcher.step_line(line)
        if lines:
            self.log.flush()  # run.log is followed live (`tail -f`) while steps run
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        if self.echo is not None:
            self.echo.flush()
