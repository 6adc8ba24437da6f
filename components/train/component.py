"""KFP component `train_grpo` (thin: the work is in harnessrl.train.round.run_train). A GPU step on the
cluster: pipelines/full.py places it with `pipelines.k8s.gpu_step`. With more than one GPU
visible in the pod the component launches one rank per GPU with torchrun (FSDP2 data parallelism, see
docs/train.md)."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def train_grpo(
    samples: Input[Dataset],
    verified: Input[Dataset],
    policy: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    config_json: str = "{}",
    seed: int = 0,
    resume: bool = True,
    lora_rank: int = 0,
):
    """GRPO update with rollout-level advantages: samples + verify rewards + policy → new policy (with
    `lora_rank` > 0: LoRA adapters of that rank are trained, the model written merged)."""
    import json
    from pathlib import Path

    import torch

    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.train.launch import run_multiprocess
    from harnessrl.train.round import TrainConfig, run_train

    configure_logging()

    from harnessrl.train.lora import with_lora_rank

    cfg_d = with_lora_rank(json.loads(config_json or "{}"), lora_rank)
    cfg_d.setdefault("train", {})["seed"] = seed
    cfg = TrainConfig.from_dict(cfg_d)
    # Work (checkpoints for --resume) lives beside the output artifact so a retried step on the same
    # artifact path resumes instead of starting over.
    work = Path(model.path).parent / (Path(model.path).name + ".work")
    gpus = torch.cuda.device_count() if cfg.device in ("auto", "cuda") else 0
    if gpus > 1:
        summary = run_multiprocess(
            gpus, samples.path, verified.path, policy.path, work, cfg, resume=resume, model_out=model.path
        )
    else:
        summary = run_train(
            samples.path,
            verified.path,
            policy.path,
            work,
            cfg,
            resume=resume,
            model_out=model.path,
        )
    publish((work / "report.md").read_text(), summary, report, metrics, html=report_html)
    model.metadata.update(
        {
            "framework": "transformers",
            "steps": summary.get("steps", 0),
            "fingerprint": summary.get("fingerprint", ""),
        }
    )
