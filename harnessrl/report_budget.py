"""A report's size budget: KFP's Markdown viewer shows only the first 400,000 characters, and a cut inside a
base64 image makes its parser quadratic. `fit_budget` brings a report under a budget well below that, in this
order, each step only while still over: long tables lose rows (a last row says how many), plots are
downsampled to thumbnails, and finally whole lines are dropped from the end (a note says so)."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from harnessrl.report_html import split_cells, table_blocks

logger = logging.getLogger(__name__)

MIN_TABLE_ROWS = 10
MIN_IMAGE_PX = 240


@dataclass
class Fitted:
    markdown: str
    notes: list[str] = field(default_factory=list)  # what was cut, for the log


def compact_png(png: bytes, max_width: int | None = None) -> bytes:
    """The PNG as a palette image (plots need few colours: ~3x smaller), downscaled to `max_width`."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        rgba = img.convert("RGBA")
    rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    if max_width is not None and rgb.width > max_width:
        height = max(1, round(rgb.height * max_width / rgb.width))
        rgb = rgb.resize((max_width, height), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    rgb.quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG (no IHDR header)")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


_HIDDEN_NOTE = "more rows not shown"


def _body_rows(lines: list[str], first: int, end: int) -> tuple[list[str], int]:
    """A table's body rows without an earlier trim's note row, and how many rows that note hid."""
    rows = lines[first + 2 : end]
    if rows and _HIDDEN_NOTE in rows[-1]:
        return rows[:-1], int(split_cells(rows[-1])[0].split()[1])
    return rows, 0


def _trim_longest_table(markdown: str) -> tuple[str, str] | None:
    """The longest table (body rows) halved, its last row saying how many rows are not shown."""
    lines = markdown.split("\n")
    tables = [(len(_body_rows(lines, first, end)[0]), first, end) for first, end in table_blocks(lines)]
    tables = [t for t in tables if t[0] > MIN_TABLE_ROWS]
    if not tables:
        return None
    _, first, end = max(tables)
    rows, hidden_before = _body_rows(lines, first, end)
    keep = max(MIN_TABLE_ROWS, len(rows) // 2)
    hidden = len(rows) - keep + hidden_before
    width = len(split_cells(lines[first]))
    note = f"| … {hidden} {_HIDDEN_NOTE} (see the step's output files) |" + " |" * (width - 1)
    lines[first + 2 : end] = [*rows[:keep], note]
    return "\n".join(lines), f"table at line {first + 1}: {hidden} rows not shown"


def _shrink_images(markdown: str) -> tuple[str, str] | None:
    """Every embedded plot at half its width (not below MIN_IMAGE_PX)."""
    from harnessrl.reports import DATA_URI_RE

    widths: list[int] = []

    def shrink(m) -> str:
        png = base64.b64decode(m["b64"])
        width = png_size(png)[0]
        if width <= MIN_IMAGE_PX:
            return m.group(0)
        small = compact_png(png, max(MIN_IMAGE_PX, width // 2))
        widths.append(png_size(small)[0])
        return f"![{m['alt']}](data:image/png;base64,{base64.b64encode(small).decode('ascii')})"

    shrunk = DATA_URI_RE.sub(shrink, markdown)
    if not widths:
        return None
    return shrunk, f"{len(widths)} plot(s) downsampled to {max(widths)} px wide"


def _cut_lines(markdown: str, budget: int, measure: Callable[[str], int]) -> tuple[str, str]:
    """Whole lines dropped from the end (never a part of an image) and a note, to fit `budget`."""
    lines = markdown.split("\n")
    total = len(lines)
    while lines:
        note = (
            f"\n\n(Report cut after {len(lines)} of {total} lines to stay under the viewer's size limit.)\n"
        )
        candidate = "\n".join(lines) + note
        if measure(candidate) <= budget:
            return candidate, f"cut after {len(lines)} of {total} lines"
        lines.pop()
    return "(Report too large to show.)\n", "everything cut"


def fit_budget(markdown: str, budget: int, measure: Callable[[str], int] = len) -> Fitted:
    """`markdown` made to measure at most `budget` (see the module docstring for how)."""
    fitted = Fitted(markdown)
    for step in (_trim_longest_table, _shrink_images):
        last_note = None
        while measure(fitted.markdown) > budget:
            changed = step(fitted.markdown)
            if changed is None:
                break
            fitted.markdown, last_note = changed
        if last_note is not None:
            fitted.notes.append(last_note)
    if measure(fitted.markdown) > budget:
        fitted.markdown, note = _cut_lines(fitted.markdown, budget, measure)
        fitted.notes.append(note)
    if fitted.notes:
        logger.warning("report over its budget of %d characters: %s", budget, "; ".join(fitted.notes))
    return fitted
