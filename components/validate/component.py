"""KFP component `validate`: the Great Expectations suite; fails the step (after reporting) on violations."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def validate(
    tasks: Input[Dataset],
    results: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    fail_on_violation: bool = True,
):
    from pathlib import Path

    from components.validate.stage import run_validate
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()

    outcome = run_validate(Path(tasks.path), Path(results.path))
    publish(outcome.report.markdown, outcome.report.metrics, report, metrics, html=report_html)
    if fail_on_violation and not outcome.success:
        raise RuntimeError(f"task set failed validation:\n{outcome.summary}")
