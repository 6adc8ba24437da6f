"""What a component hands the KFP UI: a Markdown report (PNG plots embedded as data URIs) and a Metrics file.

Used from inside components (so imports stay light: matplotlib is loaded only when a plot is drawn).
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_text


@dataclass
class StageReport:
    """What a stage hands the pipeline: the Markdown report and its numeric metrics."""

    markdown: str
    metrics: dict[str, float]


DATA_URI_RE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(data:image/png;base64,(?P<b64>[A-Za-z0-9+/=]+)\)")


def bar_chart_png(counts: Mapping[str, float], title: str, xlabel: str = "count") -> bytes:
    """A horizontal bar chart as PNG bytes (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(counts)
    values = [float(counts[k]) for k in labels]
    fig, ax = plt.subplots(figsize=(6, 0.45 * max(len(labels), 1) + 1.2), dpi=100)
    try:
        ax.barh(labels or ["(none)"], values or [0.0], color="#4c72b0")
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def embed_png(png: bytes, alt: str) -> str:
    """Markdown image with the PNG inline: the KFP UI renders it without fetching anything."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def extract_pngs(markdown: str) -> list[tuple[str, bytes]]:
    """(alt text, PNG bytes) of every embedded image, in order."""
    return [(m["alt"], base64.b64decode(m["b64"])) for m in DATA_URI_RE.finditer(markdown)]


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Numeric, finite metrics only (KFP Metrics hold numbers); booleans become 0/1."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[str(key)] = float(value)
    return out


def publish(markdown: str, metrics: Mapping[str, Any], report_artifact: Any, metrics_artifact: Any) -> None:
    """Writes the Markdown artifact and logs metrics.

    A Metrics output that writes no file never gets a kfp.local cache hit, so at least one metric is always
    logged (`metrics_logged`, the count of the others).
    """
    atomic_write_text(Path(report_artifact.path), markdown)
    numeric = clean_metrics(metrics)
    for key, value in numeric.items():
        metrics_artifact.log_metric(key, value)
    metrics_artifact.log_metric("metrics_logged", float(len(numeric)))
    atomic_write_text(
        Path(metrics_artifact.path), json.dumps(dict(metrics_artifact.metadata), sort_keys=True)
    )
