"""Every report of a small run as the KFP UI shows it, in headless Chromium (tests/reports/kfp_ui.py):

- the HTML artifact in the HTMLViewer's sandboxed iframe (every KFP UI 2.x): plots load, nothing is wider
  than the panel, table cells have borders, identifiers are intact;
- the Markdown artifact through markdown-to-jsx 7.x (KFP UI >= 2.17) under the UI's CSS reset: the same, with
  table cells kept apart by their padding instead of borders;
- the Markdown artifact through markdown-to-jsx 6.11.x (KFP UI 2.1-2.16): as above, except that its URL
  sanitizer drops every `data:` image (the reason for the HTML artifact), which the test records.

Reports: the data-prep pipeline on tests/fixtures/minirepo (real kfp.local run), the train component on a
tiny random policy, the rollout and verify report writers on a real run's rollout rows (data/rollouts.jsonl,
plus a second harness whose rollouts end otherwise), and the run summary component. Screenshots stay in the test's tmp folder
(`kfp-ui-screens*`); docs/img/kfp-ui-clean-report.png is one of them.
"""

import base64
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from kfp.dsl import HTML, Dataset, Markdown, Metrics, Model

from harnessrl.io import read_jsonl
from harnessrl.reports import REPORT_BUDGET_CHARS, publish
from pipelines.local_run import run_local
from tests.reports.kfp_ui import KfpUi, Probe, render_markdown
from tests.train.support import write_round

REPO = Path(__file__).resolve().parents[2]
MINIREPO = REPO / "tests" / "fixtures" / "minirepo"
DATA = Path(__file__).resolve().parent / "data"
CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
MIN_CELL_GAP_PX = 6
NAMES = [
    "synthesize",
    "clean",
    "validate",
    "generate-rollouts",
    "verify",
    "train-grpo",
    "summarize-run",
]  # visible text of neighbouring cells at least this far apart

pytestmark = pytest.mark.slow  # a kfp.local run, a tiny train run, Chromium: ~25 s (first run: + npm install)


@dataclass
class Report:
    name: str
    markdown: str  # the Markdown artifact
    html: str  # the HTML artifact

    def code_spans(self) -> set[str]:
        text = "\n".join(line for line in self.markdown.split("\n") if "data:image" not in line)
        return {m[2].strip() for m in CODE_SPAN_RE.finditer(text)}

    def image_count(self) -> int:
        return self.markdown.count("](data:image/png;base64,")


def artifacts(folder: Path):
    return (
        Markdown(uri=str(folder / "report")),
        Metrics(uri=str(folder / "metrics")),
        HTML(uri=str(folder / "report_html")),
    )


def read(folder: Path, name: str) -> Report:
    return Report(name, (folder / "report").read_text(), (folder / "report_html").read_text())


def data_prep_reports(root: Path) -> list[Report]:
    result = run_local(
        "data-prep", [f"source_uri={MINIREPO}", "max_tasks=2", "seed=0"], root / "dp", cache=False
    )
    assert result.status == "succeeded", result.failed_log[-20:]
    tasks = json.loads(result.index_path.read_text())["tasks"]
    reports = [
        read(Path(tasks[t]["outputs"]["report"]["path"]).parent, t)
        for t in ("synthesize", "clean", "validate")
    ]
    # the run folder's reports/: each HTML report as <task>.html (where the run summary links), and an index
    folder = result.run_dir / "reports"
    for report in reports:
        assert (folder / f"{report.name}.html").read_text() == report.html
        assert tasks[report.name]["outputs"]["report_html"]["report"] == str(folder / f"{report.name}.html")
    index = (folder / "index.html").read_text()
    assert re.findall(r'href="([^"]+)"', index) == [f"{r.name}.html" for r in reports]
    assert "Synthesized task set" in index and "Validate (Great Expectations)" in index
    return reports


def train_report(root: Path, tokenizer, policy_dir: Path) -> Report:
    """The train component itself (its python function) on a tiny round."""
    from components.train.component import train_grpo

    samples, rewards, _ = write_round(root, tokenizer, groups=3, per_group=3)
    out = root / "train"
    report, metrics, html = artifacts(out)
    train_grpo.python_func(
        samples=Dataset(uri=str(samples)),
        verified=Dataset(uri=str(rewards)),
        policy=Model(uri=str(policy_dir)),
        model=Model(uri=str(out / "model")),
        metrics=metrics,
        report=report,
        report_html=html,
        config_json=json.dumps({"groups_per_step": 1, "epochs": 2, "device": "cpu"}),
    )
    return read(out, "train-grpo")


def rollout_rows() -> list[dict]:
    """A real run's rollout rows (one harness), and a second harness whose rollouts time out or fail."""
    rows = list(read_jsonl(DATA / "rollouts.jsonl"))
    other = [
        {
            **row,
            "rollout_id": row["rollout_id"].replace("__r", "__x"),
            "spec_name": "mini-swe-agent/bubblewrap#1",
            "harness": "mini-swe-agent",
            "rollout_status": status,
            "finish_reason": reason,
            "harness_errors": {"no_tool_call": 3, "format_error": 1},
        }
        for row, (status, reason) in zip(
            rows, [("timeout", "wall_clock"), ("infra_error", "sandbox_error")] * 2, strict=True
        )
    ]
    return rows + other


def published(folder: Path, name: str, markdown: str) -> Report:
    report, metrics, html = artifacts(folder)
    publish(markdown, {}, report, metrics, html=html)
    return read(folder, name)


def rollout_reports(root: Path) -> list[Report]:
    """The generate and verify steps' reports, from their own writers, as their components publish them."""
    from harnessrl.rollout.report import plot_all, report_markdown, summarize
    from harnessrl.verify.grading import VerifyStatus
    from harnessrl.verify.rollouts import by_environment, render_report
    from harnessrl.verify.verifier import VerifyResult

    rows = rollout_rows()
    generate = report_markdown(summarize(rows, {}, 31.5, 12, 10), plot_all(rows))
    statuses = [
        VerifyStatus.RESOLVED,
        VerifyStatus.UNRESOLVED,
        VerifyStatus.APPLY_FAILED,
        VerifyStatus.INFRA_ERROR,
    ]
    ordered = [
        (
            row,
            VerifyResult(
                row["instance_id"], status, reward=None if status == "infra_error" else float(i == 0)
            ),
        )
        for i, (row, status) in enumerate(zip(rows, statuses * 2, strict=True))
    ]
    ordered[2][1].detail = "the diff does not apply: patch_failed at hunk 2 of src/minicalc/ops.py"
    ordered[2][1].dropped = [{"path": "tests/test_ops.py"}]
    summary = {"rollouts": 8, "graded": 6, "resolved": 2, "infra_errors": 2, "flagged": 0, "wall_s": 12.5}
    summary |= {
        "workers": 2,
        "status_counts": {"resolved": 2, "unresolved": 2, "apply_failed": 2, "infra_error": 2},
        "environments": by_environment(ordered, {}),
    }
    (root / "verify-out").mkdir()
    verify = render_report(summary, ordered, root / "verify-out")
    return [
        published(root / "generate-rollouts", "generate-rollouts", generate),
        published(root / "verify", "verify", verify),
    ]


def summary_report(root: Path, trained: Path) -> Report:
    """The summary component after two rounds; the stage numbers are written as their steps log them."""
    from components.summarize_run.component import summarize_run

    def metrics_file(name: str, values: dict[str, float]) -> Metrics:
        artifact = Metrics(uri=str(root / name / "metrics"))
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact.path).write_text(json.dumps(values))
        return artifact

    difficulty = metrics_file(
        "estimate-difficulty",
        {"tasks": 40, "n": 4, "valid_rollouts": 152, "passes": 61, "mixed": 22, "all_pass": 9},
    )
    selection = metrics_file("select", {"train": 27, "test": 4})
    trained_metrics = Metrics(uri=str(trained / "metrics"))
    earlier = None
    for r in (1, 2):
        folder = root / f"summarize-run-{r}"
        report, metrics, html = artifacts(folder)
        rounds = Dataset(uri=str(folder / "rounds"))
        summarize_run.python_func(
            difficulty=difficulty,
            selection=selection,
            generated=metrics_file(
                f"generate-rollouts-{r}", {"rollouts": 108, "rollouts_per_hour": 2400 + 90 * r}
            ),
            verified=metrics_file(
                f"verify-{r}", {"graded": 104, "resolved": 30 + 9 * r, "reward_mean": 0.28 + 0.08 * r}
            ),
            trained=trained_metrics,
            rounds=rounds,
            report=report,
            report_html=html,
            metrics=metrics,
            earlier=earlier,
            round_index=r,
            total_rounds=2,
        )
        earlier = rounds
    return read(root / "summarize-run-2", "summarize-run")


@pytest.fixture(scope="module")
def reports(tmp_path_factory, tokenizer, tiny_policy_dir) -> list[Report]:
    root = tmp_path_factory.mktemp("kfp-ui-run")
    trained = train_report(root, tokenizer, tiny_policy_dir)
    return [*data_prep_reports(root), *rollout_reports(root), trained, summary_report(root, root / "train")]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    kfp_ui = KfpUi.open(tmp_path_factory.mktemp("chromium"))
    yield kfp_ui
    kfp_ui.close()


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kfp-ui-screens")


@pytest.fixture(scope="module")
def rendered(reports, ui) -> dict[str, list[str]]:
    """The Markdown artifacts through each markdown-to-jsx version (after `ui`: skipped without Chromium)."""
    return {version: render_markdown(version, [r.markdown for r in reports]) for version in ("6.11", "7")}


def assert_readable(probe: Probe, report: Report) -> None:
    """What holds in every viewer: nothing wider than the panel, identifiers intact (no `_`/`*` read as
    emphasis), the whole report shown."""
    assert probe.overflow == [], f"{report.name}: wider than the panel: {probe.overflow[:5]}"
    assert probe.em == 0, f"{report.name}: {probe.em} <em> elements: underscores or stars read as emphasis"
    missing = report.code_spans() - set(probe.codes)
    assert not missing, f"{report.name}: identifiers not shown intact: {sorted(missing)[:5]}"
    assert not probe.banner


def assert_plots_shown(probe: Probe, report: Report) -> None:
    assert len(probe.images) == report.image_count() >= 1, report.name
    for image in probe.images:
        assert image["complete"] and image["naturalWidth"] > 0, f"{report.name}: plot not loaded: {image}"
        assert image["width"] > 100 and image["height"] > 50, f"{report.name}: plot shown too small: {image}"


def test_reports_stay_under_the_markdown_viewer_limit(reports):
    assert [r.name for r in reports] == NAMES
    for report in reports:
        assert len(report.markdown) <= REPORT_BUDGET_CHARS, report.name
        assert report.image_count() >= 1, report.name


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_html_artifact_in_the_sandboxed_iframe(reports, ui, screens, index):
    """KFP UI 2.x, every release: the HTML artifact."""
    report = reports[index]
    shown = ui.show_html(report.html, screens / f"{report.name}-html-iframe.png")
    assert_readable(shown.probe, report)
    assert_plots_shown(shown.probe, report)
    assert (
        shown.probe.cells > 0 and shown.probe.cell_border_min is not None and shown.probe.cell_border_min >= 1
    )
    assert shown.screenshot.stat().st_size > 5000


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_markdown_artifact_on_kfp_ui_2_17(reports, rendered, ui, screens, index):
    """KFP UI >= 2.17 (markdown-to-jsx 7.x): plots shown; tables read as tables under the CSS reset."""
    report = reports[index]
    shown = ui.show_markdown(rendered["7"][index], screens / f"{report.name}-markdown-7.png")
    assert_readable(shown.probe, report)
    assert_plots_shown(shown.probe, report)
    assert shown.probe.cell_border_min == 0  # the reset's doing: the padding below keeps cells apart
    assert shown.probe.cell_text_gap_min is not None and shown.probe.cell_text_gap_min >= MIN_CELL_GAP_PX


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_markdown_artifact_on_kfp_ui_2_1_to_2_16(reports, rendered, ui, screens, index):
    """KFP UI 2.1-2.16 (markdown-to-jsx 6.11.x): readable, but its URL sanitizer removes every data: image,
    so there the plots are only in the HTML artifact."""
    report = reports[index]
    shown = ui.show_markdown(rendered["6.11"][index], screens / f"{report.name}-markdown-6.11.png")
    assert_readable(shown.probe, report)
    assert shown.probe.cell_text_gap_min is not None and shown.probe.cell_text_gap_min >= MIN_CELL_GAP_PX
    assert len(shown.probe.images) == report.image_count() >= 1
    assert all(i["src"] == "" and i["naturalWidth"] == 0 for i in shown.probe.images), shown.probe.images


def test_the_probe_sees_what_the_issue_reports(ui, screens):
    """The checks above can fail: a report written the old way (a 1500 px plot, bare identifiers, a table
    without padding) shows every problem the issue lists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 4), dpi=100)
    fig.add_subplot().plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    old = "\n".join(
        [
            "# Rollout generation",
            "",
            "Finish reasons: {'turn_budget': 6} … {'no_tool_call': 12}.",
            "",
            "| reason | rollouts |",
            "|---|---|",
            "| no_tool_call | 12 |",
            "",
            f"![plot](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})",
        ]
    )
    v6, v7 = (render_markdown(version, [old])[0] for version in ("6.11", "7"))
    seen7 = ui.show_markdown(v7, screens / "old-report-markdown-7.png").probe
    assert seen7.em >= 1 and seen7.overflow and seen7.images[0]["naturalWidth"] == 1500
    assert seen7.cell_text_gap_min is not None and seen7.cell_text_gap_min < MIN_CELL_GAP_PX
    seen6 = ui.show_markdown(v6, screens / "old-report-markdown-6.11.png").probe
    assert seen6.em >= 1 and seen6.images[0]["src"] == "" and seen6.images[0]["naturalWidth"] == 0
