"""A report's Markdown as the KFP UI shows it: identifiers in code spans, tables padded for the UI's CSS reset,
and the same content as a standalone HTML page with its own stylesheet (the `system.HTML` artifact).

Why each step is needed (KFP UI 2.x): its Markdown viewer (markdown-to-jsx, raw HTML off) reads `a_b … c_d`
as emphasis, and its CSS reset sets `border: 0; padding: 0` on table cells, so cell texts touch. Its HTML
viewer puts the page in a sandboxed iframe (`srcdoc`), where only the page's own CSS applies.
"""

from __future__ import annotations

import html
import re
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

NBSP = "\u00a0"
# Under the reset a cell has no padding: two no-break spaces each side keep neighbouring cells apart
# (markdown-to-jsx keeps them; plain spaces are collapsed).
CELL_PAD = NBSP * 2

STYLESHEET = """
body { margin: 12px 16px; color: #1f2328; background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 1.35em; margin: .2em 0 .6em; padding-bottom: .25em; border-bottom: 1px solid #d0d7de; }
h2 { font-size: 1.15em; margin: 1.2em 0 .5em; }
h3, h4 { font-size: 1em; margin: 1em 0 .4em; }
p, ul, ol { margin: .5em 0; }
table { border-collapse: collapse; margin: .6em 0; display: block; max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #afb8c1; padding: 4px 9px; vertical-align: top; }
th { background: #f0f2f4; text-align: left; }
tr:nth-child(even) td { background: #f8f9fa; }
img { display: block; max-width: 100%; height: auto; margin: .6em 0; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
  font-size: .9em; background: #f0f2f4; border-radius: 3px; }
code { padding: .05em .3em; overflow-wrap: break-word; }
pre { padding: 8px; overflow-x: auto; }
pre code { padding: 0; background: none; }
"""

_FENCE_RE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
# spans left as they are: code spans, images and links (text and target), autolinks, bare URLs
_PROTECTED_RE = re.compile(r"(`+).+?\1|!?\[[^\]]*\]\([^)]*\)|<[a-z]+:[^>\s]*>|https?://\S+")
_TOKEN_RE = re.compile(r"[\w.:/*\-]+")
_EDGE_RE = re.compile(r"^[*.:/\-]*(.*?)[*.:/\-]*$")
_DELIMITER_ROW_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")  # GFM: only an escaped pipe does not split, even in code


def _code_tokens(text: str) -> str:
    """Identifiers with `_` or `*` in plain text, each as a code span (the bold markers around stay)."""

    def wrap(m: re.Match[str]) -> str:
        token = m.group(0)
        edge = _EDGE_RE.match(token)
        assert edge is not None  # the pattern matches any string
        core = edge.group(1)
        if not core or not any(c.isalnum() for c in core) or not ("_" in core or "*" in core):
            return token
        start = edge.start(1)
        return f"{token[:start]}`{core}`{token[start + len(core) :]}"

    return _TOKEN_RE.sub(wrap, text)


def code_identifiers(markdown: str) -> str:
    """Every bare identifier containing `_` or `*` put in backticks, outside code (spans, fenced and indented
    blocks), links and images: markdown-to-jsx (KFP's Markdown viewer) otherwise pairs the underscores of
    `{'turn_budget': 6} … {'no_tool_call': 12}` into emphasis. Report writers should use backticks
    themselves (`harnessrl.reports.code`); this catches what they miss, e.g. names from other libraries."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        opening = _FENCE_RE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if opening:
            fence = opening.group(1)
            out.append(line)
            continue
        if line.startswith(("    ", "\t")) and not line.lstrip().startswith(("-", "*", "|")):
            out.append(line)  # an indented code block
            continue
        pieces: list[str] = []
        last = 0
        for m in _PROTECTED_RE.finditer(line):
            pieces += [_code_tokens(line[last : m.start()]), m.group(0)]
            last = m.end()
        pieces.append(_code_tokens(line[last:]))
        out.append("".join(pieces))
    return "\n".join(out)


def split_cells(row: str) -> list[str]:
    """A table row's cells (outer pipes dropped)."""
    text = row.strip()
    text = text[1:] if text.startswith("|") else text
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    return [c.strip() for c in _CELL_SPLIT_RE.split(text)]


def table_blocks(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of the GFM tables: a header row, a delimiter row, then body rows."""
    blocks: list[tuple[int, int]] = []
    i = 0
    while i + 1 < len(lines):
        if "|" in lines[i] and _DELIMITER_ROW_RE.match(lines[i + 1]) and "|" in lines[i + 1]:
            end = i + 2
            while end < len(lines) and lines[end].strip() and "|" in lines[end]:
                end += 1
            blocks.append((i, end))
            i = end
        else:
            i += 1
    return blocks


def pad_tables(markdown: str) -> str:
    """Each table cell wrapped in no-break spaces, so a table still reads as one under KFP's CSS reset."""
    lines = markdown.split("\n")
    for first, end in table_blocks(lines):
        for i in range(first, end):
            if i == first + 1:
                continue  # the delimiter row
            cells = split_cells(lines[i])
            lines[i] = "| " + " | ".join(f"{CELL_PAD}{c}{CELL_PAD}" for c in cells) + " |"
    return "\n".join(lines)


@cache
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt

    # CommonMark plus GFM tables; raw HTML is escaped, like KFP's viewer (disableParsingRawHTML).
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def title_of(markdown: str, default: str = "report") -> str:
    for line in markdown.split("\n"):
        if line.startswith("#"):
            return line.lstrip("#").strip().replace("`", "") or default
    return default


def render_html(markdown: str, title: str | None = None) -> str:
    """A standalone page (no external fetches) with the report's content and its stylesheet."""
    body = _parser().render(markdown)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title or title_of(markdown))}</title>\n<style>{STYLESHEET}</style>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )
