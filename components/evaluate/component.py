"""KFP component `evaluate` (thin: the work is in components/evaluate/stage.run_evaluate): base policy vs the
trained policy on a task set (the held-out split), through the same generate -> verify path as training."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def evaluate(
    tasks: Input[Dataset],
    base_policy: Input[Model],
    policy: Input[Model],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    k: int = 4,
    concurrency: int = 8,  # rollouts in flight (harnessrl.rollout.generate.DEFAULT_CONCURRENCY)
    specs_json: str = "",
    engine_url: str = "",
    seed: int = 0,
):
    """pass@1 (Wilson 95%) and pass@k of `base_policy` and `policy`, and their difference (paired bootstrap).

    k: rollouts per task, sampled at the specs' temperature; k=1 evaluates greedily (temperature 0).
    engine_url: one remote engine serves both policies in turn (each checkpoint is loaded into it first).
    `evaluation` is the comparable JSON (`harnessrl stage evaluate --compare A.json B.json`).
    """
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from components.evaluate.stage import EvaluateConfig, Policy, run_evaluate
    from harnessrl.evaluate.results import EvalMode
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.rollout.specs import parse_specs

    configure_logging()

    specs = parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None
    remote = engine_url or None
    policies = [
        Policy("base", base_policy.path, remote, push_weights=remote is not None),
        Policy("trained", policy.path, remote, push_weights=remote is not None),
    ]
    mode = EvalMode.GREEDY if k == 1 else EvalMode.SAMPLED
    work = Path(tempfile.mkdtemp(prefix="harnessrl-evaluate-"))
    try:
        result = run_evaluate(
            Path(tasks.path),
            work / "out",
            policies,
            specs,
            EvaluateConfig(k=k, modes=(mode,), seed=seed, concurrency=concurrency),
        )
        Path(evaluation.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "out" / "evaluation.json", evaluation.path)
        flat = json.loads((work / "out" / "metrics.json").read_text())
        publish((work / "out" / "report.md").read_text(), flat, report, metrics, html=report_html)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    evaluation.metadata.update({"schema": result["schema"], "mode": str(mode), "k": k})
