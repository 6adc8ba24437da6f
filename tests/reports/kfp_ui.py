"""The KFP UI's two report viewers, rebuilt from the libraries it uses, in headless Chromium.

- Markdown (`system.Markdown`): markdown-to-jsx (6.11.x in KFP UI 2.1-2.16, 7.x from 2.17) rendered with
  React the way the UI's MarkdownViewer does (raw HTML off, links as external links, content cut at
  400,000 characters), inside the UI's CSS reset, in a panel of `PANEL_WIDTH_PX`.
- HTML (`system.HTML`): the page as the `srcdoc` of a sandboxed iframe (`allow-scripts`, 100% wide, 600 px
  high), the way the UI's HTMLViewer shows it.

Chromium is driven over the DevTools protocol (websocket-client); the npm packages are installed into a
cache folder on first use. `KfpUi.open` skips the calling test, with one line, where Chromium, node or the
npm registry is not available.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harnessrl.reports import PANEL_WIDTH_PX

HERE = Path(__file__).resolve().parent
NPM_CACHE = Path(os.environ.get("HARNESSRL_KFP_UI_CACHE", Path.home() / ".cache" / "harnessrl" / "kfp-ui"))
# markdown-to-jsx as KFP UI releases pin it, each with the React it ran with there
MARKDOWN_TO_JSX = {
    "6.11": {"markdown-to-jsx": "6.11.4", "react": "16.14.0", "react-dom": "16.14.0"},
    "7": {"markdown-to-jsx": "7.7.17", "react": "18.3.1", "react-dom": "18.3.1"},
}
IFRAME_HEIGHT_PX = 600

# What the UI's stylesheet does to a report rendered from Markdown (its CSS reset on every element a report
# uses, its page font, and the MarkdownViewer's own rules). The HTML artifact's iframe gets none of it.
KFP_UI_CSS = """
html, body, div, span, h1, h2, h3, h4, h5, h6, p, blockquote, pre, a, code, em, img, strong, ol, ul, li,
table, caption, tbody, tfoot, thead, tr, th, td { border: 0; margin: 0; padding: 0; vertical-align: baseline; }
ol, ul { list-style: none; }
table { border-collapse: collapse; border-spacing: 0; }
body { background: white; color: rgba(0, 0, 0, 0.66); font-family: "Public Sans", system-ui, sans-serif;
  font-size: 13px; }
.markdown-viewer h1, .markdown-viewer h2, .markdown-viewer h3, .markdown-viewer h4 { position: relative;
  margin-top: 1em; margin-bottom: 16px; font-size: initial; font-weight: 700; line-height: 1.4; }
.markdown-viewer h1, .markdown-viewer h2 { padding-bottom: .3em; border-bottom: 1px solid #eee; }
.markdown-viewer code, .markdown-viewer pre { background-color: #f8f8f8; border-radius: 5px; }
.markdown-viewer pre { border: solid 1px #eee; margin: 7px 0; padding: 7px; }
"""

# Measures a rendered report: `root` holds it, `right` is the panel's right edge.
PROBE_JS = r"""
(root, right) => {
  const clipped = el => {
    for (let p = el.parentElement; p && p !== root; p = p.parentElement) {
      if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const overflow = [];
  for (const el of root.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if ((r.width || r.height) && !clipped(el) && r.right > right + 0.5) {
      overflow.push(`${el.tagName.toLowerCase()} ends at ${Math.round(r.right)} px`);
    }
  }
  const images = [...root.querySelectorAll('img')].map(i => ({
    alt: i.alt, src: (i.getAttribute('src') || '').slice(0, 22), complete: i.complete,
    naturalWidth: i.naturalWidth, width: i.getBoundingClientRect().width,
    height: i.getBoundingClientRect().height,
  }));
  const cells = [...root.querySelectorAll('td, th')];
  const borders = cells.map(c => {
    const s = getComputedStyle(c);
    return Math.min(...['Top', 'Right', 'Bottom', 'Left'].map(
      side => s[`border${side}Style`] === 'none' ? 0 : parseFloat(s[`border${side}Width`])));
  });
  const textSpan = el => {  // left and right edge of a cell's visible text
    let l = Infinity, r = -Infinity;
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n; (n = walk.nextNode());) {
      const t = n.data, lead = t.length - t.replace(/^[\s\u00a0]+/, '').length;
      const end = t.replace(/[\s\u00a0]+$/, '').length;
      if (end <= lead) continue;
      const range = document.createRange();
      range.setStart(n, lead); range.setEnd(n, end);
      const b = range.getBoundingClientRect();
      l = Math.min(l, b.left); r = Math.max(r, b.right);
    }
    return [l, r];
  };
  let gap = Infinity;
  for (const row of root.querySelectorAll('tr')) {
    const spans = [...row.children].map(textSpan).filter(([l, r]) => l < r);
    for (let i = 1; i < spans.length; i++) gap = Math.min(gap, spans[i][0] - spans[i - 1][1]);
  }
  return {
    overflow, images, cells: cells.length,
    cell_border_min: borders.length ? Math.min(...borders) : null,
    cell_text_gap_min: gap === Infinity ? null : gap,
    em: root.querySelectorAll('em').length,
    codes: [...root.querySelectorAll('code')].map(c => c.textContent),
    banner: !!document.querySelector('.banner'),
    height: Math.ceil(root.getBoundingClientRect().height),
  };
}
"""


@dataclass
class Probe:
    overflow: list[str]
    images: list[dict[str, Any]]
    cells: int
    cell_border_min: float | None  # thinnest border of a table cell (px)
    cell_text_gap_min: float | None  # least space between the texts of neighbouring cells (px)
    em: int
    codes: list[str]
    banner: bool
    height: int


def install_markdown_to_jsx(version: str) -> Path:
    """A folder with node_modules/ holding markdown-to-jsx `version` and its React (cached)."""
    deps = MARKDOWN_TO_JSX[version]
    folder = NPM_CACHE / f"markdown-to-jsx-{deps['markdown-to-jsx']}"
    installed = folder / "node_modules" / "markdown-to-jsx" / "package.json"
    if installed.is_file() and json.loads(installed.read_text())["version"] == deps["markdown-to-jsx"]:
        return folder
    if shutil.which("npm") is None:
        pytest.skip(
            "npm is not installed (apt-get install nodejs npm): the KFP UI's Markdown viewer cannot be rebuilt"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(json.dumps({"private": True, "dependencies": deps}, indent=1))
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"npm install of {deps} failed (registry unreachable?): {done.stderr.strip()[-200:]}")
    return folder


def render_markdown(version: str, documents: list[str]) -> list[str]:
    """Each document as markdown-to-jsx `version` renders it in the KFP UI (static HTML)."""
    folder = install_markdown_to_jsx(version)
    done = subprocess.run(
        ["node", str(HERE / "render_markdown.js"), str(folder)],
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


class Chromium:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, workdir: Path) -> None:
        import websocket

        self.workdir = workdir
        profile = workdir / "profile"
        self.log = open(workdir / "chromium.log", "w")  # closed in close()
        self.proc = subprocess.Popen(
            [
                "chromium",
                "--headless=new",
                "--no-sandbox",  # we run as root
                "--disable-gpu",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                # keeps the sandboxed iframe in the page's process, where DevTools can evaluate in it
                "--disable-features=IsolateSandboxedIframes",
                "--disable-site-isolation-trials",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it chose here
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start (log: {workdir / 'chromium.log'})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str) -> None:
        while not any(e.get("method") == event for e in self.events):
            self.events.append(json.loads(self.ws.recv()))
        self.events.clear()

    def load(self, page: str, width: int, height: int) -> None:
        path = Path(tempfile.mkstemp(suffix=".html", dir=self.workdir)[1])
        path.write_text(page)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        self.call("Page.navigate", url=path.as_uri())
        self.wait_for("Page.loadEventFired")

    def probe(self, root_js: str, right_js: str, context_id: int | None = None) -> Probe:
        expression = f"({PROBE_JS})({root_js}, {right_js})"
        params: dict[str, Any] = {"expression": expression, "returnByValue": True}
        if context_id is not None:
            params["contextId"] = context_id
        result = self.call("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"probe failed: {result['exceptionDetails']}")
        return Probe(**result["result"]["value"])

    def iframe_context(self) -> int:
        """An execution context in the (only) child frame, where its DOM can be read."""
        tree = self.call("Page.getFrameTree")["frameTree"]
        (child,) = tree.get("childFrames", [])
        world = self.call("Page.createIsolatedWorld", frameId=child["frame"]["id"], worldName="probe")
        return world["executionContextId"]

    def screenshot(self, path: Path, width: int, height: int) -> Path:
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


PAGE_MARGIN_PX = 20


def markdown_page(rendered: str) -> str:
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{KFP_UI_CSS}"
        f"#panel {{ position: absolute; left: {PAGE_MARGIN_PX}px; top: {PAGE_MARGIN_PX}px; "
        f"width: {PANEL_WIDTH_PX}px; }}</style></head>"
        f"<body><div id='panel'><div class='markdown-viewer'>{rendered}</div></div></body></html>"
    )


def iframe_page(document: str) -> str:
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{KFP_UI_CSS}"
        f"#panel {{ position: absolute; left: {PAGE_MARGIN_PX}px; top: {PAGE_MARGIN_PX}px; "
        f"width: {PANEL_WIDTH_PX}px; }} iframe {{ border: 1px solid rgba(0, 0, 0, 0.12); box-sizing: border-box; "
        f"width: 100%; height: {IFRAME_HEIGHT_PX}px; min-height: {IFRAME_HEIGHT_PX}px; }}</style></head>"
        f"<body><div id='panel'><iframe sandbox='allow-scripts' src='javascript:void(0);' "
        f'srcdoc="{html.escape(document, quote=True)}"></iframe></div></body></html>'
    )


@dataclass
class Shown:
    probe: Probe
    screenshot: Path


class KfpUi:
    """Shows reports in the rebuilt viewers; `open` skips the test when the browser tools are missing."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.browser = Chromium(workdir)

    @classmethod
    def open(cls, workdir: Path) -> KfpUi:
        for tool, how in (
            ("chromium", "apt-get install chromium (make sysdeps)"),
            ("node", "apt-get install nodejs"),
        ):
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} is not installed ({how}): the KFP UI viewers cannot be rebuilt")
        return cls(workdir)

    def show_markdown(self, rendered: str, screenshot: Path) -> Shown:
        width = PANEL_WIDTH_PX + 2 * PAGE_MARGIN_PX
        self.browser.load(markdown_page(rendered), width, 900)
        probe = self.browser.probe(
            "document.querySelector('.markdown-viewer')",
            "document.getElementById('panel').getBoundingClientRect().right",
        )
        height = probe.height + 2 * PAGE_MARGIN_PX
        return Shown(probe, self.browser.screenshot(screenshot, width, height))

    def show_html(self, document: str, screenshot: Path) -> Shown:
        width = PANEL_WIDTH_PX + 2 * PAGE_MARGIN_PX
        height = IFRAME_HEIGHT_PX + 2 * PAGE_MARGIN_PX
        self.browser.load(iframe_page(document), width, height)
        probe = self.browser.probe(
            "document.body", "document.documentElement.clientWidth", self.browser.iframe_context()
        )
        return Shown(probe, self.browser.screenshot(screenshot, width, height))

    def close(self) -> None:
        self.browser.close()
