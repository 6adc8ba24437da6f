"""KFP components of the run summary. `summarize_run` (harnessrl-rounds): after a round, the run so far in one
report (tasks, pass rates, reward and loss, throughput, links to the stage reports); the last round's is the
run's summary. `summarize_rl_run` (harnessrl-full): tasks, the RL loop and the held-out evaluation."""

from typing import Optional

from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def summarize_run(
    difficulty: Input[Metrics],
    selection: Input[Metrics],
    generated: Input[Metrics],
    verified: Input[Metrics],
    trained: Input[Metrics],
    rounds: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    earlier: Optional[Input[Dataset]] = None,  # noqa: UP045 (KFP reads Optional[...], not `| None`)
    round_index: int = 1,
    total_rounds: int = 1,
):
    """`earlier`: the previous round's `rounds` (none for round 1)."""
    from pathlib import Path

    from components.summarize_run.stage import RoundRecord, read_metrics, run_summary
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()

    this_round = RoundRecord(
        round_index,
        read_metrics(generated, "generate-rollouts"),
        read_metrics(verified, "verify"),
        read_metrics(trained, "train-grpo"),
    )
    result = run_summary(
        read_metrics(difficulty, "estimate-difficulty"),
        read_metrics(selection, "select"),
        this_round,
        Path(earlier.path) if earlier is not None else None,
        Path(rounds.path),
        total_rounds=total_rounds,
    )
    publish(result.markdown, result.metrics, report, metrics, html=report_html)
    rounds.metadata.update({"rounds": round_index})


@component
def summarize_rl_run(
    difficulty: Input[Metrics],
    selection: Input[Metrics],
    family: Input[Metrics],
    trained: Input[Metrics],
    trained_steps: Input[Artifact],
    evaluated: Input[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    evaluation: Optional[Input[Artifact]] = None,  # noqa: UP045 (KFP reads Optional[...], not `| None`)
    mode: str = "colocated",
):
    """The run summary of `harnessrl-full`: tasks, the RL loop (`trained`: its Metrics; `trained_steps`: its
    `tensorboard` artifact, which holds steps.jsonl) and the held-out evaluation (`evaluated`: its Metrics;
    `evaluation`: its evaluation.json, for one request answered side by side)."""
    from pathlib import Path

    from components.summarize_run.rl import read_evaluation, read_steps, render_rl_summary
    from components.summarize_run.stage import read_metrics
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()
    result = render_rl_summary(
        read_metrics(difficulty, "estimate-difficulty"),
        read_metrics(selection, "select"),
        read_metrics(trained, "rl-loop"),
        read_metrics(evaluated, "evaluate"),
        read_steps(Path(trained_steps.path)),
        mode,
        read_metrics(family, "task-family"),
        read_evaluation(Path(evaluation.path)) if evaluation is not None else None,
    )
    publish(result.markdown, result.metrics, report, metrics, html=report_html)
