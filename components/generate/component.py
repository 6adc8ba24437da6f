"""KFP component `generate_rollouts` (thin: the work is in generate.run_generate). A GPU step on the cluster."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def generate_rollouts(
    tasks: Input[Dataset],
    policy: Input[Model],
    rollouts: Output[Dataset],
    samples: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    group_size: int = 4,
    specs_json: str = "",
    concurrency: int = 8,  # rollouts in flight (harnessrl.rollout.generate.DEFAULT_CONCURRENCY)
    engine_url: str = "",
    seed: int = 0,
    executor: str = "threads",
    ray_cpus: float = 0.5,
    tool_parser: str = "",
):
    """N rollouts per task through harness ↔ gateway ↔ engine: rollouts (rows, records, transcripts) and samples.

    executor: "threads" (in this pod) or "ray" (Ray tasks; the cluster in the pod's RAY_ADDRESS env, else local).
    tool_parser: the gateway's tool-call format (hermes | qwen | qwen3_coder); "" reads it off the chat template.
    """
    import json
    import shutil
    from pathlib import Path

    from harnessrl.choices import parse_choice
    from harnessrl.gateway.toolcalls import ToolParser
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.rollout.executors import ExecutorName
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.rollout.specs import parse_specs

    configure_logging()

    specs = parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None
    out = Path(rollouts.path)
    result = run_generate(
        Path(tasks.path),
        out,
        specs,
        ModelSource(
            checkpoint=policy.path,
            engine_url=engine_url or None,
            tool_parser=parse_choice(ToolParser, tool_parser, "tool_parser") if tool_parser else None,
        ),
        GenerateConfig(
            group_size=group_size,
            concurrency=concurrency,
            seed=seed,
            executor=ExecutorName(executor),
            ray_cpus=ray_cpus,
        ),
    )
    Path(samples.path).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "samples.parquet", Path(samples.path) / "samples.parquet")
    flat = {k: v for k, v in result.items() if not isinstance(v, dict)}
    flat.update({f"status_{k}": v for k, v in result["status"].items()})
    publish((out / "report.md").read_text(), flat, report, metrics, html=report_html)
    rollouts.metadata.update({"rollouts": result["rollouts"], "tasks": result["tasks"]})
