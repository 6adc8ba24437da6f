"""KFP component `synthesize`: SWE-smith-style tasks from a Python repo directory or sdist."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def synthesize(
    source: Input[Artifact],
    tasks: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    max_tasks: int = 20,
    seed: int = 0,
    timeout_s: float = 120.0,
):
    from pathlib import Path

    from components.synthesize.stage import run_synthesize
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()

    result = run_synthesize(
        Path(source.path), Path(tasks.path), max_tasks=max_tasks, seed=seed, timeout_s=timeout_s
    )
    publish(result.markdown, result.metrics, report, metrics, html=report_html)
