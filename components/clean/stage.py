"""Clean stage as the pipeline runs it: kept task set + rejected rows with reasons, plus the report."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harnessrl.reports import StageReport, bar_chart_png, embed_png


def clean_params(**overrides: Any):
    """CleanParams with the given fields set; an unknown field is an error naming the known ones."""
    from dataprep.clean import CleanParams

    known = {f.name for f in dataclasses.fields(CleanParams)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"clean: unknown parameter(s) {unknown}; CleanParams has {sorted(known)}")
    return CleanParams(**overrides)


def run_clean(tasks: Path, kept_out: Path, rejected_out: Path, **params: Any) -> StageReport:
    from dataprep.clean import clean_taskset

    report = clean_taskset(Path(tasks), Path(kept_out), Path(rejected_out), clean_params(**params))
    markdown = report.markdown()
    counts = {"kept": report.n_kept, **{f"rejected: {k}": v for k, v in sorted(report.reasons.items()) if v}}
    markdown += (
        "\n"
        + embed_png(
            bar_chart_png(counts, "rows kept, and rejected per reason", "rows"),
            "rows kept and rejected per reason",
        )
        + "\n"
    )
    metrics = {
        "n_in": report.n_in,
        "n_kept": report.n_kept,
        "n_rejected": report.n_rejected,
        **report.metrics(),
    }
    return StageReport(markdown=markdown, metrics=metrics)
