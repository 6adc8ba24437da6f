"""Synthesize stage as the pipeline runs it: a task set from a source repo/sdist, plus its report."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harnessrl.reports import StageReport, bar_chart_png, code, embed_png
from harnessrl.taskset import TaskSet


def modifier_of(instance_id: str) -> str:
    """SWE-smith ids look like `<repo>.<hash>__<modifier>__<n>`."""
    parts = instance_id.split("__")
    return parts[1] if len(parts) >= 3 else "unknown"


def summarize_taskset(ts: TaskSet, title: str) -> StageReport:
    rows = ts.rows()
    by_modifier = Counter(modifier_of(r.get("instance_id", "")) for r in rows)
    metrics: dict[str, float] = {
        "tasks": float(len(rows)),
        "repos": float(len(set(r.get("repo") for r in rows))),
    }
    for key, value in ts.manifest.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in metrics:
            metrics[f"manifest_{key}"] = float(value)
    lines = [
        f"# {title}",
        "",
        f"**{len(rows)} tasks** from `{ts.manifest.get('source', '?')}`",
        "",
        "| bug modifier | tasks |",
        "|---|---|",
    ]
    lines += [f"| {code(name)} | {n} |" for name, n in sorted(by_modifier.items())]
    if by_modifier:
        lines += [
            "",
            embed_png(
                bar_chart_png(dict(sorted(by_modifier.items())), "tasks per bug modifier"),
                "tasks per bug modifier",
            ),
        ]
    return StageReport(markdown="\n".join(lines) + "\n", metrics=metrics)


def run_synthesize(source: Path, out: Path, *, max_tasks: int, seed: int, timeout_s: float) -> StageReport:
    from dataprep.synthesize import synthesize_taskset

    ts = synthesize_taskset(Path(source), Path(out), max_tasks=max_tasks, seed=seed, timeout_s=timeout_s)
    return summarize_taskset(ts, "Synthesized task set")
