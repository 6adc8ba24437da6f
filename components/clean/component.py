"""KFP component `clean`: drops rows by the rules in dataprep.clean; a dropped row keeps all its reasons."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def clean(
    tasks: Input[Dataset],
    kept: Output[Dataset],
    rejected: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    max_tests: int = 200,
    require_f2p: bool = True,
    require_problem_statement: bool = True,
    check_branches: bool = True,
    drop_duplicates: bool = True,
):
    from pathlib import Path

    from components.clean.stage import run_clean
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()

    result = run_clean(
        Path(tasks.path),
        Path(kept.path),
        Path(rejected.path),
        max_tests=max_tests,
        require_f2p=require_f2p,
        require_problem_statement=require_problem_statement,
        check_branches=check_branches,
        drop_duplicates=drop_duplicates,
    )
    publish(result.markdown, result.metrics, report, metrics, html=report_html)
