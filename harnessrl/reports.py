"""What a component hands the KFP UI: a Markdown report (PNG plots embedded as data URIs), the same report as
an HTML page, and a Metrics file.

KFP UI 2.1-2.16 drop `data:` images from Markdown and its CSS reset strips table borders, while every 2.x
release shows an HTML artifact as the page itself (sandboxed iframe); so `publish` writes both, from one
Markdown text, under one size budget (harnessrl/report_html.py, harnessrl/report_budget.py). Plots are drawn
for the UI's artifact panel: `FIGURE_WIDTH_PX` wide.

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
from typing import TYPE_CHECKING, Any

from harnessrl.io import atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANEL_WIDTH_PX = 800  # the KFP UI's artifact panel we design for
FIGURE_DPI = 96  # 10 pt text is then 13 px, the UI's own font size
FIGURE_WIDTH_PX = 768
FIGURE_WIDTH_IN = FIGURE_WIDTH_PX / FIGURE_DPI
# The Markdown viewer truncates at 400,000 characters; each report stays well under it.
REPORT_BUDGET_CHARS = 200_000


@dataclass
class StageReport:
    """What a stage hands the pipeline: the Markdown report and its numeric metrics."""

    markdown: str
    metrics: dict[str, float]


DATA_URI_RE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(data:image/png;base64,(?P<b64>[A-Za-z0-9+/=]+)\)")


def new_figure(height_in: float, nrows: int = 1, ncols: int = 1) -> tuple[Figure, Any]:
    """(figure, axes) of the panel's width (`FIGURE_WIDTH_PX`), Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(FIGURE_WIDTH_IN, height_in), dpi=FIGURE_DPI, squeeze=False)


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes at its own size (no tight bbox: the width stays the panel's); closes it."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=FIGURE_DPI)
        return buf.getvalue()
    finally:
        plt.close(fig)


def bar_chart_png(counts: Mapping[str, float], title: str, xlabel: str = "count") -> bytes:
    """A horizontal bar chart as PNG bytes."""
    labels = list(counts)
    values = [float(counts[k]) for k in labels]
    fig, axes = new_figure(0.32 * max(len(labels), 1) + 1.3)
    ax = axes[0][0]
    ax.barh(labels or ["(none)"], values or [0.0], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return figure_png(fig)


def embed_png(png: bytes, alt: str) -> str:
    """Markdown image with the PNG inline (as a palette PNG, ~3x smaller): nothing to fetch."""
    from harnessrl.report_budget import compact_png

    return f"![{alt}](data:image/png;base64,{base64.b64encode(compact_png(png)).decode('ascii')})"


def code(value: object) -> str:
    """`value` as a Markdown code span: identifiers keep their `_` and `*` in every viewer."""
    text = str(value)
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def counts_text(counts: Mapping[str, Any]) -> str:
    """`{'turn_budget': 6, 'no_tool_call': 12}` as "`turn_budget` 6, `no_tool_call` 12" ("none" when empty)."""
    return ", ".join(f"{code(k)} {v}" for k, v in counts.items()) or "none"


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


def publish(
    markdown: str,
    metrics: Mapping[str, Any],
    report_artifact: Any,
    metrics_artifact: Any,
    *,
    html: Any,
    budget: int = REPORT_BUDGET_CHARS,
) -> None:
    """Writes the Markdown artifact and the HTML artifact (same content, under `budget` characters) and logs
    metrics.

    A Metrics output that writes no file never gets a kfp.local cache hit, so at least one metric is always
    logged (`metrics_logged`, the count of the others).
    """
    from harnessrl.report_budget import fit_budget
    from harnessrl.report_html import code_identifiers, pad_tables, render_html

    fitted = fit_budget(code_identifiers(markdown), budget, measure=lambda md: len(pad_tables(md)))
    atomic_write_text(Path(report_artifact.path), pad_tables(fitted.markdown))
    atomic_write_text(Path(html.path), render_html(fitted.markdown))
    numeric = clean_metrics(metrics)
    for key, value in numeric.items():
        metrics_artifact.log_metric(key, value)
    metrics_artifact.log_metric("metrics_logged", float(len(numeric)))
    atomic_write_text(
        Path(metrics_artifact.path), json.dumps(dict(metrics_artifact.metadata), sort_keys=True)
    )
