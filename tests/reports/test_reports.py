"""The shared report helper: one Markdown text → the Markdown artifact (identifiers in code spans, tables that
read as tables under KFP's CSS reset) and the HTML artifact (its own stylesheet), panel-sized plots, and a
size budget well under the Markdown viewer's 400,000 characters."""

import base64
import io
import json
import logging
import random
import re

from kfp.dsl import HTML, Markdown, Metrics

from harnessrl.report_budget import fit_budget, png_size
from harnessrl.report_html import NBSP, code_identifiers, pad_tables, split_cells, table_blocks
from harnessrl.reports import (
    DATA_URI_RE,
    FIGURE_WIDTH_PX,
    PANEL_WIDTH_PX,
    REPORT_BUDGET_CHARS,
    bar_chart_png,
    code,
    counts_text,
    embed_png,
    extract_pngs,
    publish,
)


def artifacts(tmp_path):
    return (
        Markdown(uri=str(tmp_path / "report")),
        Metrics(uri=str(tmp_path / "metrics")),
        HTML(uri=str(tmp_path / "report_html")),
    )


def noise_png(width: int, height: int, seed: int) -> bytes:
    """A PNG that does not compress (worst case for the budget)."""
    from PIL import Image

    rng = random.Random(seed)
    img = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_publish_writes_the_markdown_and_html_artifacts_from_one_text(tmp_path):
    report, metrics, html = artifacts(tmp_path)
    md = "\n".join(
        [
            "# Rollout generation",
            "",
            "Finish reasons: {'turn_budget': 6} … {'no_tool_call': 12}.",
            "",
            "| reason | rollouts |",
            "|---|---:|",
            "| no_tool_call | 12 |",
            "",
            embed_png(bar_chart_png({"turn_budget": 6, "no_tool_call": 12}, "finish reasons"), "reasons"),
            "",
        ]
    )
    publish(
        md, {"rollouts": 18, "note": "text is not a metric", "nan": float("nan")}, report, metrics, html=html
    )

    written = (tmp_path / "report").read_text()
    assert "{'`turn_budget`': 6} … {'`no_tool_call`': 12}" in written
    assert f"| {NBSP * 2}`no_tool_call`{NBSP * 2} | {NBSP * 2}12{NBSP * 2} |" in written
    assert len(extract_pngs(written)) == 1
    page = (tmp_path / "report_html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>Rollout generation</title>" in page
    assert "<code>turn_budget</code>" in page and "<code>no_tool_call</code>" in page and "<em>" not in page
    assert "<table>" in page and re.search(r"th, td \{ border: 1px solid", page)
    assert "img { display: block; max-width: 100%" in page
    (src,) = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(src) == extract_pngs(written)[0][1]
    assert json.loads((tmp_path / "metrics").read_text()) == {"rollouts": 18.0, "metrics_logged": 1.0}


def test_identifiers_become_code_spans_outside_code_links_and_images():
    md = "\n".join(
        [
            "**5 tasks** from `/tmp/a_b`; reward_mean, loss_first and a*b*c; [see x_y](https://h/x_y) 2 * 3",
            "![plot_a](data:image/png;base64,iVBO) and <https://h/p_q>",
            "```",
            "keep_as_is = 1",
            "```",
            "    indented_code_block",
        ]
    )
    assert code_identifiers(md).split("\n") == [
        "**5 tasks** from `/tmp/a_b`; `reward_mean`, `loss_first` and `a*b*c`; [see x_y](https://h/x_y) 2 * 3",
        "![plot_a](data:image/png;base64,iVBO) and <https://h/p_q>",
        "```",
        "keep_as_is = 1",
        "```",
        "    indented_code_block",
    ]
    assert code_identifiers("**instance_id**") == "**`instance_id`**"
    assert code("a`b") == "``a`b``" and code("x_y") == "`x_y`"
    assert counts_text({"turn_budget": 6, "no_tool_call": 12}) == "`turn_budget` 6, `no_tool_call` 12"
    assert counts_text({}) == "none"


def test_tables_are_padded_cell_by_cell_and_nothing_else_changes():
    md = "a | b is not a table\n\n| x | y |\n|:---|---:|\n| `p\\|q` | 2 |\n| | 3 |\n\nafter | table"
    padded = pad_tables(md)
    lines = padded.split("\n")
    assert lines[0] == "a | b is not a table" and lines[-1] == "after | table"
    assert lines[3] == "|:---|---:|"
    p = NBSP * 2
    assert lines[2] == f"| {p}x{p} | {p}y{p} |"
    assert lines[4] == f"| {p}`p\\|q`{p} | {p}2{p} |"
    assert lines[5] == f"| {p}{p} | {p}3{p} |"
    assert split_cells(lines[5]) == ["", "3"]
    assert table_blocks(padded.split("\n")) == [(2, 6)]


def test_figures_are_drawn_at_the_panel_width():

    assert FIGURE_WIDTH_PX <= PANEL_WIDTH_PX
    assert png_size(bar_chart_png({"a": 1.0}, "t"))[0] == FIGURE_WIDTH_PX


def test_train_curves_are_panel_sized_and_a_long_history_table_is_spaced(tmp_path):
    from harnessrl.train.report import HISTORY_TABLE_ROWS, plot_curves, spaced_rows

    history = [{"step": i, "loss": 1 / (i + 1), "reward_mean": i % 3} for i in range(500)]
    png = plot_curves(history, tmp_path / "curves.png")
    assert png_size(png.read_bytes())[0] == FIGURE_WIDTH_PX
    shown = spaced_rows(history, HISTORY_TABLE_ROWS)
    assert len(shown) == HISTORY_TABLE_ROWS and shown[0]["step"] == 0 and shown[-1]["step"] == 499


def long_report(rows: int, images: int) -> str:
    lines = ["# Verify", "", "| rollout | status |", "|---|---|"]
    lines += [f"| `task_{i:05d}-r0` | `resolved` |" for i in range(rows)]
    lines += [""] + [
        f"![plot {i}](data:image/png;base64,{base64.b64encode(noise_png(768, 200, i)).decode()})"
        for i in range(images)
    ]
    return "\n".join(lines) + "\n"


def test_publish_keeps_a_long_report_under_the_budget(tmp_path, caplog):
    report, metrics, html = artifacts(tmp_path)
    md = long_report(rows=5000, images=4)
    assert len(md) > 2 * REPORT_BUDGET_CHARS
    with caplog.at_level(logging.WARNING, logger="harnessrl.report_budget"):
        publish(md, {}, report, metrics, html=html)
    written = (tmp_path / "report").read_text()
    assert len(written) <= REPORT_BUDGET_CHARS
    assert "over its budget" in caplog.text
    # the table lost rows, and says how many
    note = re.search(r"… (\d+) more rows not shown", written)
    assert note is not None
    hidden = int(note[1])
    shown = len(re.findall(r"`task_\d{5}-r0`", written))
    assert shown >= 10 and shown + hidden == 5000
    # every plot is still there, whole, as a smaller PNG
    pngs = extract_pngs(written)
    assert len(pngs) == 4
    assert all(png_size(png)[0] < 768 for _alt, png in pngs)
    page = (tmp_path / "report_html").read_text()
    assert page.count("<img ") == 4 and f"{hidden} more rows not shown" in page


def test_a_report_that_cannot_shrink_enough_is_cut_at_a_line_with_a_note():
    md = long_report(rows=0, images=6)
    budget = 40_000  # the 6 plots fit only as 240 px thumbnails, and not all of them
    fitted = fit_budget(md, budget)
    assert len(fitted.markdown) <= budget and "Report cut after" in fitted.markdown
    kept = DATA_URI_RE.findall(fitted.markdown)
    assert 0 < len(kept) < 6 and all(png_size(base64.b64decode(b64)) for _alt, b64 in kept)
    assert fitted.notes[-1].startswith("cut after")


def test_a_report_under_budget_is_unchanged():
    md = long_report(rows=20, images=0)
    assert fit_budget(md, REPORT_BUDGET_CHARS).markdown == md
