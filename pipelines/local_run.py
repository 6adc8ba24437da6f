"""Runs a pipeline locally with kfp.local (SubprocessRunner, this Python env) in a run directory:

<run dir>/run.json      index: pipeline, arguments, status, every task's outputs (path, type, metrics)
<run dir>/pipeline.yaml the compiled IR that ran
<run dir>/run.log       full kfp.local log (every step's stdout/stderr)
<run dir>/artifacts/    kfp.local pipeline root: <pipeline>-<time>/<task>/<output>
<run dir>/reports/      each Markdown report (+ its plots as PNG files) and index.md
<run dir>/inputs/       local copies of s3:// / minio:// arguments (kfp.local reads only local files)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_json, atomic_write_text
from harnessrl.reports import DATA_URI_RE, extract_pngs

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
TASK_START_RE = re.compile(r"Executing task '([^']+)'")
TASK_END_RE = re.compile(r"Task '([^']+)' finished with status (\w+)")
CACHE_HIT_RE = re.compile(r"Task '?([^' ]+)'? cache hit \(key=([0-9a-f]+)\)")
PIPELINE_FAILED_RE = re.compile(r"Inner task failed: (.+?)\.?$")


class LocalRunError(Exception):
    """The local run could not start (bad pipeline name/file or arguments)."""


@dataclass
class RunResult:
    run_dir: Path
    status: str  # succeeded | failed | interrupted
    failed_task: str | None = None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    reports: list[Path] = field(default_factory=list)
    failed_log: list[str] = field(default_factory=list)  # the failed step's last log lines

    @property
    def failure_reason(self) -> str | None:
        """The failed step's error (e.g. `ValueError: ...` and the problem lines under it), if any."""
        lines = [ln for ln in self.failed_log if not TASK_END_RE.search(ln)]
        for i in range(len(lines) - 1, -1, -1):
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Interrupt)\b.*:", lines[i]):
                return "\n".join(lines[i : i + 6])
        return lines[-1] if lines else None

    @property
    def index_path(self) -> Path:
        return self.run_dir / "run.json"


def default_run_dir(pipeline_name: str, root: str | Path = "runs") -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{pipeline_name}-{stamp}"


def load_runnable(pipeline: str) -> tuple[str, Any]:
    """(name, pipeline object) from a registered name or a compiled pipeline YAML file."""
    from pipelines.registry import PIPELINES, load_pipeline

    if pipeline in PIPELINES:
        return pipeline, load_pipeline(pipeline)
    path = Path(pipeline)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        from kfp import components

        comp = components.load_component_from_file(str(path))
        return comp.name, comp
    raise LocalRunError(
        f"{pipeline!r} is neither a registered pipeline ({', '.join(PIPELINES)}) "
        "nor a compiled pipeline .yaml file"
    )


_CASTS = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float}


def parse_arguments(pipeline: Any, pairs: list[str] | None) -> dict[str, Any]:
    """`k=v` strings typed by the pipeline's parameters; unknown names and bad values are clear errors."""
    inputs = pipeline.component_spec.inputs or {}
    args: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise LocalRunError(f"--arg {pair!r}: expected NAME=VALUE")
        key, value = pair.split("=", 1)
        if key not in inputs:
            raise LocalRunError(
                f"--arg {key}: {pipeline.name} has no parameter {key!r}; "
                f"it has {', '.join(sorted(inputs)) or 'none'}"
            )
        kind = str(inputs[key].type).upper()
        try:
            if kind in ("BOOLEAN", "BOOL"):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                args[key] = value.lower() in ("true", "1", "yes")
            elif kind in ("LIST", "STRUCT", "JSONARRAY", "JSONOBJECT"):
                args[key] = json.loads(value)
            else:
                args[key] = {"INTEGER": int, "FLOAT": float, "DOUBLE": float}.get(
                    kind, _CASTS.get(kind, str)
                )(value)
        except (ValueError, json.JSONDecodeError):
            raise LocalRunError(f"--arg {key}={value!r}: not a valid {inputs[key].type}") from None
    missing = sorted(
        k for k, spec in inputs.items() if k not in args and spec.default is None and not spec.optional
    )
    if missing:
        raise LocalRunError(f"{pipeline.name}: missing required argument(s) {missing}; pass --arg NAME=VALUE")
    return args


def localize_uris(args: Mapping[str, Any], inputs_dir: Path | None = None) -> dict[str, Any]:
    """Makes `*_uri` arguments readable by kfp.local, which only reads local files: local paths become
    absolute; `s3://`/`minio://` URIs are fetched with harnessrl.store into `inputs_dir` (resumable,
    checksum-verified) and replaced by the local copy."""
    out = dict(args)
    for key, value in args.items():
        if not (key.endswith("_uri") and isinstance(value, str)):
            continue
        if value.startswith(("s3://", "minio://")) and inputs_dir is not None:
            out[key] = str(fetch_remote_input(value, inputs_dir / key))
        elif "://" not in value:
            path = Path(value).expanduser()
            if not path.exists():
                raise LocalRunError(f"--arg {key}={value}: no such file or directory")
            out[key] = str(path.resolve())
    return out


def fetch_remote_input(uri: str, dest_dir: Path) -> Path:
    """One object → dest_dir/<name>; a prefix (e.g. a task-set directory) → dest_dir/<last path part>/."""
    from harnessrl.store import ObjectStore, S3Uri, StoreError

    parsed = S3Uri.parse(uri)
    name = parsed.key.rstrip("/").rsplit("/", 1)[-1] or parsed.bucket
    try:
        store = ObjectStore.from_env()
        if parsed.key and not parsed.key.endswith("/"):
            try:
                store.stat(uri)
                return store.download_file(uri, dest_dir / name).path
            except StoreError as e:
                if "NoSuchKey" not in str(e) and "404" not in str(e):
                    raise
        store.download_dir(uri, dest_dir / name)
        return dest_dir / name
    except StoreError as e:
        raise LocalRunError(f"fetching {uri} for the local run: {e}") from None


class _ProgressTee(io.TextIOBase):
    """Writes everything to the log file; echoes one line per task start/finish to the console."""

    def __init__(self, log: io.TextIOBase, console: Any, verbose: bool) -> None:
        self.log, self.console, self.verbose = log, console, verbose
        self.buffer_line = ""
        self.started: dict[str, float] = {}
        self.failed: str | None = None
        self.current_lines: list[str] = []
        self.failed_lines: list[str] = []
        self.cache_hits: dict[str, str] = {}  # task -> cache key prefix
        self.running: str | None = None
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> _ProgressTee:
        if not self.verbose:
            self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _beat(self, every_s: float = 60.0) -> None:
        """A line per minute for long steps (steps' own output goes to run.log only)."""
        while not self._stop.wait(every_s):
            task = self.running
            secs = time.monotonic() - self.started.get(task, time.monotonic()) if task else 0.0
            if secs >= every_s / 2:
                self.console.print(f"    … {task} running for {secs:.0f} s (log: run.log)", highlight=False)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        if self.verbose:
            self.console.file.write(text)
        self.buffer_line += text
        *lines, self.buffer_line = self.buffer_line.split("\n")
        for line in lines:
            self._watch(ANSI_RE.sub("", line))
        return len(text)

    def flush(self) -> None:
        self.log.flush()

    def _watch(self, line: str) -> None:
        self.current_lines = (self.current_lines + [line])[-60:]
        if m := CACHE_HIT_RE.search(line):
            self.cache_hits[m[1]] = m[2]
            if not self.verbose:
                self.console.print(f"  [green]✓[/] {m[1]} (cached)", highlight=False)
        elif m := TASK_START_RE.search(line):
            self.current_lines = []
            self.started[m[1]] = time.monotonic()
            self.running = m[1]
            if not self.verbose:
                self.console.print(f"  [cyan]▶[/] {m[1]}", highlight=False)
        elif m := TASK_END_RE.search(line):
            self.running = None
            secs = time.monotonic() - self.started.get(m[1], time.monotonic())
            ok = m[2] == "SUCCESS"
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            if not self.verbose:
                self.console.print(f"  {mark} {m[1]} ({secs:.1f} s)", highlight=False)
            if not ok and self.failed is None:
                self.failed = m[1]
                self.failed_lines = [ln.strip() for ln in self.current_lines if ln.strip()][-40:]


@contextlib.contextmanager
def _sigterm_as_interrupt():
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
def _root_logging_to(stream: io.TextIOBase):
    """kfp.local logs cache hits at INFO outside its own logging context: route those into the tee too."""
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _artifact_types(spec: dict) -> dict[str, dict[str, str]]:
    """task name -> output name -> artifact schema title (or parameter type), over all DAGs."""
    components = spec.get("components", {})
    out: dict[str, dict[str, str]] = {}

    def walk(dag: dict) -> None:
        for task_name, task in dag.get("tasks", {}).items():
            comp = components.get(task["componentRef"]["name"], {})
            defs = comp.get("outputDefinitions", {})
            types = {k: v["artifactType"]["schemaTitle"] for k, v in defs.get("artifacts", {}).items()}
            types.update({k: v.get("parameterType", "") for k, v in defs.get("parameters", {}).items()})
            out[task_name] = types
            if "dag" in comp:
                walk(comp["dag"])

    walk(spec.get("root", {}).get("dag", {}))
    return out


def _collect_outputs(pipeline_run_dir: Path, spec: dict) -> dict[str, dict[str, Any]]:
    types = _artifact_types(spec)
    tasks: dict[str, dict[str, Any]] = {}
    for exec_out in sorted(pipeline_run_dir.rglob("executor_output.json")):
        task_dir = exec_out.parent
        task_key = task_dir.relative_to(pipeline_run_dir).as_posix()
        task_name = task_dir.name
        try:
            data = json.loads(exec_out.read_text())
        except json.JSONDecodeError:
            continue
        outputs: dict[str, Any] = {}
        for name, group in data.get("artifacts", {}).items():
            for art in group.get("artifacts", []):
                path = Path(art["uri"])
                entry = {
                    "type": types.get(task_name, {}).get(name, "system.Artifact"),
                    "path": str(path),
                    "exists": path.exists(),
                }
                if art.get("metadata"):
                    entry["metadata"] = art["metadata"]
                outputs[name] = entry
        for name, value in data.get("parameterValues", {}).items():
            outputs[name] = {"type": types.get(task_name, {}).get(name, "parameter"), "value": value}
        tasks[task_key] = {"status": "succeeded", "outputs": outputs}
    return tasks


def _partial_outputs(pipeline_run_dir: Path, task_name: str, spec: dict) -> dict[str, Any]:
    """Whatever output files a failed step left (it wrote no executor_output.json)."""
    types = _artifact_types(spec).get(task_name, {})
    outputs: dict[str, Any] = {}
    for task_dir in (d for d in pipeline_run_dir.rglob(task_name) if d.is_dir()):
        for name, kind in types.items():
            path = task_dir / name
            if kind.startswith("system.") and path.exists():
                outputs[name] = {"type": kind, "path": str(path), "exists": True, "partial": True}
    return outputs


def _cached_outputs(cache_hits: Mapping[str, str], cache_root: Path, spec: dict) -> dict[str, dict[str, Any]]:
    """Outputs of steps kfp.local reused from its cache (they live in the run that computed them)."""
    types = _artifact_types(spec)
    tasks: dict[str, dict[str, Any]] = {}
    for task_name, key in cache_hits.items():
        entries = sorted(cache_root.glob(f"{key}*.json"))
        if not entries:
            continue
        outputs: dict[str, Any] = {}
        for name, value in json.loads(entries[0].read_text()).items():
            if isinstance(value, dict) and value.get("__kfp_artifact__"):
                path = Path(value["uri"])
                outputs[name] = {
                    "type": value.get("schema_title", "system.Artifact"),
                    "path": str(path),
                    "exists": path.exists(),
                    "metadata": value.get("metadata", {}),
                }
            else:
                outputs[name] = {"type": types.get(task_name, {}).get(name, "parameter"), "value": value}
        tasks[task_name] = {"status": "cached", "outputs": outputs}
    return tasks


def _write_reports(tasks: Mapping[str, dict[str, Any]], reports_dir: Path) -> list[Path]:
    """Each Markdown output → reports/<task>[-<output>].md with its plots as PNG files beside it."""
    written: list[Path] = []
    sections: list[str] = []
    for task_key, task in sorted(tasks.items()):
        for out_name, out in task["outputs"].items():
            if out.get("type") != "system.Markdown" or not out.get("exists"):
                continue
            stem = task_key.replace("/", "__") + ("" if out_name == "report" else f"-{out_name}")
            markdown = Path(out["path"]).read_text()
            pngs = extract_pngs(markdown)
            for i, (_alt, png) in enumerate(pngs):
                png_path = reports_dir / f"{stem}-{i}.png"
                png_path.parent.mkdir(parents=True, exist_ok=True)
                png_path.write_bytes(png)
            counter = iter(range(len(pngs)))
            linked = DATA_URI_RE.sub(
                lambda m, c=counter, s=stem: f"![{m['alt']}]({s}-{next(c)}.png)", markdown
            )
            md_path = atomic_write_text(reports_dir / f"{stem}.md", linked)
            written.append(md_path)
            sections.append(f"## {task_key}\n\n" + linked.replace("\n# ", "\n### "))
            task["outputs"][out_name]["report"] = str(md_path)
    if sections:
        written.insert(
            0, atomic_write_text(reports_dir / "index.md", "# Run reports\n\n" + "\n\n".join(sections))
        )
    return written


def _read_metrics(tasks: Mapping[str, dict[str, Any]]) -> None:
    for task in tasks.values():
        for out in task["outputs"].values():
            if out.get("type") != "system.Metrics":
                continue
            out["values"] = dict(out.pop("metadata", {}))
            if not out["values"] and out.get("exists"):
                with contextlib.suppress(json.JSONDecodeError, OSError):
                    out["values"] = json.loads(Path(out["path"]).read_text())


def run_local(
    pipeline: str,
    arguments: list[str] | Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
    *,
    cache: bool = True,
    verbose: bool = False,
    console: Any = None,
) -> RunResult:
    """Runs `pipeline` (name or compiled YAML) with kfp.local; always writes run.json, even on failure."""
    from kfp import compiler, local
    from rich.console import Console

    # bound to the stdout of the caller now: steps' output is redirected into run.log below
    console = Console(file=console.file if console is not None else sys.stdout, soft_wrap=True)
    name, runnable = load_runnable(pipeline)
    run_dir = Path(run_dir) if run_dir else default_run_dir(name)
    run_dir = run_dir.resolve()
    typed = (
        parse_arguments(runnable, list(arguments)) if not isinstance(arguments, Mapping) else dict(arguments)
    )
    args = localize_uris(typed, inputs_dir=run_dir / "inputs")
    artifacts = run_dir / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(runnable, str(run_dir / "pipeline.yaml"))
    import yaml

    spec = next(yaml.safe_load_all((run_dir / "pipeline.yaml").read_text()))
    cache_root = run_dir.parent / ".kfp-cache"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(artifacts),
        raise_on_error=True,
        enable_caching=cache,
        cache_root=str(cache_root) if cache else None,
    )
    started = dt.datetime.now(dt.UTC)
    before = set(artifacts.iterdir())
    console.print(f"[bold]{name}[/]: running locally in {run_dir}", highlight=False)
    status, failed_task, error, failed_log = "succeeded", None, None, []
    with (
        open(run_dir / "run.log", "a", encoding="utf-8") as log,
        _ProgressTee(log, console, verbose) as tee,
        _root_logging_to(tee),
        _sigterm_as_interrupt(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(tee),
    ):
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        try:
            runnable(**args)
        except RuntimeError as e:
            status, error = "failed", ANSI_RE.sub("", str(e))
            m = PIPELINE_FAILED_RE.search(error)
            failed_task = tee.failed or (m[1].strip("'") if m else None)
            failed_log = tee.failed_lines
        except KeyboardInterrupt:  # keep what finished and say so; re-raised once run.json is written
            status, error, failed_task = "interrupted", "interrupted by the user", tee.running
            failed_log = tee.current_lines[-40:]
    new_dirs = sorted(set(artifacts.iterdir()) - before, key=lambda p: p.stat().st_mtime)
    tasks = _cached_outputs(tee.cache_hits, cache_root, spec)
    tasks.update(_collect_outputs(new_dirs[-1], spec) if new_dirs else {})
    if failed_task:
        tasks[failed_task] = {
            "status": "failed",
            "outputs": (_partial_outputs(new_dirs[-1], failed_task, spec) if new_dirs else {}),
        }
    _read_metrics(tasks)
    reports = _write_reports(tasks, run_dir / "reports")
    result = RunResult(
        run_dir=run_dir,
        status=status,
        failed_task=failed_task,
        tasks=tasks,
        reports=reports,
        failed_log=failed_log,
    )
    atomic_write_json(
        result.index_path,
        {
            "pipeline": name,
            "arguments": args,
            "status": status,
            "failed_task": failed_task,
            "error": error,
            "failed_log_tail": failed_log,
            "started": started.isoformat(),
            "finished": dt.datetime.now(dt.UTC).isoformat(),
            "run_dir": str(run_dir),
            "pipeline_root": str(new_dirs[-1]) if new_dirs else None,
            "log": str(run_dir / "run.log"),
            "reports": [str(p) for p in reports],
            "tasks": tasks,
            "python": sys.executable,
            "cwd": os.getcwd(),
        },
    )
    if status == "interrupted":
        raise KeyboardInterrupt(f"interrupted; partial results indexed in {result.index_path}")
    return result
