"""Validate stage as the pipeline runs it: the Great Expectations suite over a task set, plus the report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harnessrl.reports import StageReport, bar_chart_png, embed_png


@dataclass
class ValidateOutcome:
    report: StageReport
    success: bool
    summary: str


def run_validate(tasks: Path, out_dir: Path) -> ValidateOutcome:
    """Never raises on a failed suite: the caller writes the report first, then fails the step."""
    from dataprep.validate import validate_taskset

    result = validate_taskset(Path(tasks), Path(out_dir), raise_on_failure=False)
    success = bool(result.success)
    metrics = {"success": success, **result.metrics()}
    markdown = result.markdown()
    evaluated = metrics.get("expectations_evaluated")
    failed = metrics.get("expectations_failed")
    if isinstance(evaluated, (int, float)) and isinstance(failed, (int, float)):
        chart = bar_chart_png(
            {"passed": evaluated - failed, "failed": failed}, "expectations", "expectations"
        )
        markdown += "\n" + embed_png(chart, "expectations passed and failed") + "\n"
    return ValidateOutcome(
        StageReport(markdown=markdown, metrics=metrics), success, "" if success else markdown
    )
