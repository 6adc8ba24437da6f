"""KFP component `verify`: task rows + rollouts -> rewards dataset (rewards.jsonl, logs), report, metrics."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def verify(
    tasks: Input[Dataset],
    rollouts: Input[Dataset],
    verified: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    workers: int = 2,
    timeout_s: float = 300.0,
    memory_mb: int = 2048,
    sandbox: str = "bubblewrap",
    network: str = "",
):
    """Grades each rollout's final workspace (or diff) in a fresh sandbox with SWE-bench rules.

    sandbox: bubblewrap (in this pod) | podman | kubernetes (a fresh pod of the task's image_name per test run,
    in the sandbox namespace); network: the egress allow-list those pods get ("" = none).
    """
    from pathlib import Path

    from harnessrl.choices import parse_choice
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.sandbox.backends import SandboxChoice
    from harnessrl.sandbox.base import Limits
    from harnessrl.schema import SandboxKind
    from harnessrl.verify.rollouts import run_verify

    configure_logging()

    summary = run_verify(
        Path(tasks.path),
        Path(rollouts.path),
        Path(verified.path),
        workers,
        timeout_s=timeout_s,
        limits=Limits(memory_mb=memory_mb),
        sandbox=SandboxChoice(parse_choice(SandboxKind, sandbox, "sandbox"), network or None),
    )
    keys = (
        "rollouts",
        "graded",
        "resolved",
        "infra_errors",
        "flagged",
        "reward_mean",
        "verifications_per_min",
    )
    publish(
        (Path(verified.path) / "report.md").read_text(),
        {k: summary.get(k) for k in keys},
        report,
        metrics,
        html=report_html,
    )
    verified.metadata.update({"rollouts": summary["rollouts"], "resolved": summary["resolved"]})
