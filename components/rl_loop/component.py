"""KFP component `rl_loop` (thin: the work is in components/rl_loop/stage.py, as for `harnessrl stage rl`). One long-running GPU step on the
cluster: the engine(s), gateway, rollout workers, verifiers and trainer for `steps` optimizer steps. Its
work directory lives beside the `model` artifact, so a retried step on the same artifact path resumes from
its last checkpoint instead of starting over. With `nproc` > 1 the step runs the loop under torchrun with that many
trainer ranks, one GPU each (harnessrl.rl.ranks); the pipeline sets `nproc` and the step's GPU count from the
same parameter."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import component


@component
def rl_loop(
    tasks: Input[Dataset],
    policy: Input[Model],
    model: Output[Model],
    checkpoints: Output[Artifact],
    metrics: Output[Metrics],
    tensorboard: Output[Artifact],
    report: Output[Markdown],
    report_html: Output[HTML],
    mode: str = "colocated",
    steps: int = 10,
    batch_groups: int = 4,
    group_size: int = 4,
    max_staleness: int = 1,
    save_every: int = 0,
    engine_url: str = "",
    specs_json: str = "",
    config_json: str = "{}",
    seed: int = 0,
    resume: bool = True,
    upload_to: str = "",
    nproc: int = 1,
    lora_rank: int = 0,
):
    """The RL loop (sync | colocated | separate): generate → verify → train → sync weights, for `steps` steps.

    engine_url: remote engines, comma-separated (several: behind the router); "" = in-process engine.
    upload_to: s3:// prefix that checkpoints and the final model are streamed to ("" = none).
    nproc: trainer ranks (one GPU each; rank 0 also runs the engine, gateway and rollouts).
    lora_rank: > 0 trains LoRA adapters of this rank instead of every weight (0: as config_json says).
    """
    import json
    import os
    import shutil
    from pathlib import Path

    from components.rl_loop.stage import build_config, run_stage
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish
    from harnessrl.rl.config import RLInputs
    from harnessrl.rl.modes import WorkloadKind
    from harnessrl.rollout.specs import parse_specs

    configure_logging()
    settings = dict(
        mode=mode,
        steps=steps,
        batch_groups=batch_groups,
        group_size=group_size,
        max_staleness=max_staleness,
        save_every=save_every,
        seed=seed,
        nproc=nproc,
    )
    cfg = build_config(json.loads(config_json or "{}"), settings, lora_rank=lora_rank)
    cfg.train.seed = seed
    specs = parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None
    work = Path(model.path).parent / (Path(model.path).name + ".work")
    inputs = RLInputs(
        WorkloadKind.SWE,
        Path(tasks.path),
        work,
        policy=policy.path,
        specs=specs,
        engine_urls=[u.strip() for u in engine_url.split(",") if u.strip()],
        resume=resume,
        model_out=Path(model.path),
        upload_to=upload_to or None,
    )
    summary = run_stage(cfg, inputs, echo=lambda line: print(line, flush=True))
    assert summary is not None  # the component is never a trainer rank other than 0

    def link_tree(src: Path, dest: Path) -> None:  # hard links: checkpoints are large, same file system
        shutil.rmtree(dest, ignore_errors=True)
        if not src.is_dir():
            dest.mkdir(parents=True)
            return
        try:
            shutil.copytree(src, dest, copy_function=os.link)
        except OSError:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)

    link_tree(work / "checkpoints", Path(checkpoints.path))
    link_tree(work / "tensorboard", Path(tensorboard.path))
    shutil.copyfile(work / "steps.jsonl", Path(tensorboard.path) / "steps.jsonl")
    publish((work / "report.md").read_text(), summary.to_dict(), report, metrics, html=report_html)
    model.metadata.update({"framework": "transformers", "steps": summary.steps, "version": summary.version})
    checkpoints.metadata.update({"save_every": save_every, "uploaded_to": upload_to})
