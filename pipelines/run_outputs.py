"""The `tasks` section of a local run's run.json, and its reports/ folder, from the task records."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_text
from harnessrl.reports import DATA_URI_RE, extract_pngs
from pipelines.local_tasks import TaskRecord, TaskStatus


def _artifact_entry(artifact: Any) -> dict[str, Any]:
    path = Path(artifact.uri)
    entry: dict[str, Any] = {"type": artifact.schema_title, "path": str(path), "exists": path.exists()}
    if artifact.metadata:
        entry["metadata"] = dict(artifact.metadata)
    return entry


def _outputs(record: TaskRecord, definitions: Mapping[str, Any]) -> dict[str, Any]:
    from kfp import dsl

    parameter_types = {k: v.get("parameterType", "") for k, v in definitions.get("parameters", {}).items()}
    outputs: dict[str, Any] = {}
    for name, value in record.outputs.items():
        if isinstance(value, dsl.Artifact):
            outputs[name] = _artifact_entry(value)
        elif isinstance(value, list) and value and all(isinstance(v, dsl.Artifact) for v in value):
            outputs[name] = {"type": value[0].schema_title, "artifacts": [_artifact_entry(v) for v in value]}
        else:
            outputs[name] = {"type": parameter_types.get(name, "parameter"), "value": value}
    return outputs


def _partial_outputs(record: TaskRecord, definitions: Mapping[str, Any]) -> dict[str, Any]:
    """Whatever output files a failed or interrupted step left in its task folder."""
    outputs: dict[str, Any] = {}
    if record.task_root is None:  # it never got as far as starting a step process
        return outputs
    for name, spec in definitions.get("artifacts", {}).items():
        path = record.task_root / name
        if path.exists():
            kind = spec["artifactType"]["schemaTitle"]
            outputs[name] = {"type": kind, "path": str(path), "exists": True, "partial": True}
    return outputs


def task_entries(records: Iterable[TaskRecord], spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """task name -> {status, seconds, outputs}; a name that ran more than once (a loop) gets `#2`, `#3`..."""
    components = spec.get("components", {})
    tasks: dict[str, dict[str, Any]] = {}
    for record in records:
        definitions = components.get(record.component, {}).get("outputDefinitions", {})
        done = record.status in (TaskStatus.SUCCEEDED, TaskStatus.CACHED)
        key, n = record.name, 1
        while key in tasks:
            n += 1
            key = f"{record.name}#{n}"
        tasks[key] = {
            "status": str(record.status),
            "seconds": round(record.seconds, 3),
            "outputs": _outputs(record, definitions) if done else _partial_outputs(record, definitions),
        }
    _read_metrics(tasks)
    return tasks


def _read_metrics(tasks: Mapping[str, dict[str, Any]]) -> None:
    """A Metrics output's values: from its metadata (kfp's log_metric), else from its file."""
    for task in tasks.values():
        for out in task["outputs"].values():
            if out.get("type") != "system.Metrics":
                continue
            out["values"] = dict(out.pop("metadata", {}))
            if not out["values"] and out.get("exists"):
                with contextlib.suppress(json.JSONDecodeError, OSError):
                    out["values"] = json.loads(Path(out["path"]).read_text())


def _write_html_reports(tasks: Mapping[str, dict[str, Any]], reports_dir: Path) -> list[Path]:
    """Each HTML output → reports/<task>[-<output>].html (as the KFP UI shows it: the page itself), and an
    index.html linking them in run order; the run summary's links point at these files."""
    from harnessrl.report_html import render_html

    written: list[Path] = []
    for task_key, task in tasks.items():
        for out_name, out in task["outputs"].items():
            if out.get("type") != "system.HTML" or not out.get("exists"):
                continue
            stem = task_key.replace("/", "__").replace("#", "-") + (
                "" if out_name == "report_html" else f"-{out_name}"
            )
            path = reports_dir / f"{stem}.html"
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out["path"], path)
            written.append(path)
            out["report"] = str(path)
    if written:
        titles = [re.search(r"<title>(.*?)</title>", p.read_text()) for p in written]
        items = [f"- [{p.stem}]({p.name}): {t[1] if t else ''}" for p, t in zip(written, titles, strict=True)]
        index = render_html("# Run reports\n\n" + "\n".join(items) + "\n", title="Run reports")
        written.insert(0, atomic_write_text(reports_dir / "index.html", index))
    return written


def write_reports(tasks: Mapping[str, dict[str, Any]], reports_dir: Path) -> list[Path]:
    """Each Markdown output → reports/<task>[-<output>].md with its plots as PNG files beside it, and an
    index.md of them all; each HTML output → reports/<task>.html and index.html; each output entry gets the
    path of its report."""
    html_reports = _write_html_reports(tasks, reports_dir)
    written: list[Path] = []
    sections: list[str] = []
    for task_key, task in sorted(tasks.items()):
        for out_name, out in task["outputs"].items():
            if out.get("type") != "system.Markdown" or not out.get("exists"):
                continue
            stem = task_key.replace("/", "__").replace("#", "-") + (
                "" if out_name == "report" else f"-{out_name}"
            )
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
            out["report"] = str(md_path)
    if sections:
        written.insert(
            0, atomic_write_text(reports_dir / "index.md", "# Run reports\n\n" + "\n\n".join(sections))
        )
    return written + html_reports
