"""KFP components `estimate_difficulty` (Best-of-N generate + verify) and `select` (train/test task sets)."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def estimate_difficulty(
    tasks: Input[Dataset],
    policy: Input[Model],
    estimates: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    n: int = 4,
    specs_json: str = "",
    concurrency: int = 8,  # rollouts in flight (harnessrl.rollout.generate.DEFAULT_CONCURRENCY)
    verify_workers: int = 2,
    engine_url: str = "",
    executor: str = "threads",
):
    """Best-of-N rollouts of the policy per task, verified: pass counts, history (round 0), histogram."""
    import json
    from pathlib import Path

    from components.estimate_difficulty.stage import run_estimate
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.rollout.executors import ExecutorName
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.rollout.specs import parse_specs

    configure_logging()

    specs = parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None
    result = run_estimate(
        Path(tasks.path),
        Path(estimates.path),
        n=n,
        specs=specs,
        model=ModelSource(checkpoint=policy.path, engine_url=engine_url or None),
        concurrency=concurrency,
        verify_workers=verify_workers,
        executor=ExecutorName(executor),
    )
    publish(
        (Path(estimates.path) / "report.md").read_text(),
        {k: v for k, v in result.items() if not isinstance(v, dict)},
        report,
        metrics,
        html=report_html,
    )
    estimates.metadata.update({"tasks": result["tasks"], "n": n})
