"""KFP component `sft` (cold start, before RL): trajectories + policy → fine-tuned policy (thin: the work is in
components/sft/stage.py run_sft). A GPU step on the cluster like `train_grpo`; with more than one GPU in the pod
the training part runs one rank per GPU (torchrun, FSDP2)."""

from typing import Optional

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def sft(
    tasks: Input[Dataset],
    policy: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    rollouts: Optional[Input[Dataset]] = None,  # noqa: UP045 (KFP reads Optional[...], not `| None`)
    verified: Optional[Input[Dataset]] = None,  # noqa: UP045
    source: str = "demonstrations",
    epochs: int = 3,
    config_json: str = "{}",
    specs_json: str = "",
    seed: int = 0,
    resume: bool = True,
):
    """`source`: demonstrations | rejection | both (harnessrl.train.modes.SftSource); rejection sampling reads
    `rollouts` (an earlier generate output) and `verified` (its verify output). `specs_json`: the harness
    spec(s) the demonstrations are acted out with — the RL step's, so the policy learns the format it will use."""
    import json
    from pathlib import Path

    import torch

    from components.sft.stage import SftConfig, run_sft
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.rollout.specs import parse_specs

    configure_logging()

    cfg_d = json.loads(config_json or "{}")
    cfg_d.update({"source": source, "epochs": epochs})
    cfg_d.setdefault("train", {})["seed"] = seed
    cfg = SftConfig.from_dict(cfg_d)
    # beside the output artifact, so a retried step on the same artifact path resumes instead of starting over
    work = Path(model.path).parent / (Path(model.path).name + ".work")
    gpus = torch.cuda.device_count() if cfg.device in ("auto", "cuda") else 0
    summary = run_sft(
        tasks.path,
        policy.path,
        work,
        cfg,
        rollouts=rollouts.path if rollouts is not None else None,
        verified=verified.path if verified is not None else None,
        specs=parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None,
        resume=resume,
        model_out=model.path,
        nproc=max(gpus, 1),
    )
    publish((work / "report.md").read_text(), summary, report, metrics, html=report_html)
    model.metadata.update({"framework": "transformers", "steps": summary.get("steps", 0), "stage": "sft"})
