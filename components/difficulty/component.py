"""KFP components `estimate_difficulty` (Best-of-N generate + verify) and `select` (train/test task sets)."""

from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from harnessrl.components.kfp_common import component


@component
def estimate_difficulty(
    tasks: Input[Dataset],
    policy: Input[Model],
    estimates: Output[Dataset],
    report: Output[Markdown],
    metrics: Output[Metrics],
    n: int = 4,
    specs_json: str = "",
    concurrency: int = 4,
    verify_workers: int = 2,
    engine_url: str = "",
    executor: str = "threads",
):
    """Best-of-N rollouts of the policy per task, verified: pass counts, history (round 0), histogram."""
    import json
    from pathlib import Path

    from harnessrl.components.difficulty.estimate import run_estimate
    from harnessrl.components.rollout.policy import PolicySource
    from harnessrl.components.rollout.specs import parse_specs
    from harnessrl.pipelines.reports import publish

    specs = parse_specs(json.loads(specs_json), "specs_json") if specs_json.strip() else None
    result = run_estimate(Path(tasks.path), Path(estimates.path), n=n, specs=specs,
                          policy=PolicySource(checkpoint=policy.path, engine_url=engine_url or None),
                          concurrency=concurrency, verify_workers=verify_workers, progress=False,
                          executor=executor)
    publish((Path(estimates.path) / "report.md").read_text(),
            {k: v for k, v in result.items() if not isinstance(v, dict)}, report, metrics)
    estimates.metadata.update({"tasks": result["tasks"], "n": n})


@component
def select(
    tasks: Input[Dataset],
    difficulty: Input[Dataset],
    selected: Output[Dataset],
    held_out: Output[Dataset],
    report: Output[Markdown],
    metrics: Output[Metrics],
    k_all_fail: int = 0,
    test_fraction: float = 0.1,
    seed: int = 0,
):
    """Drop all-pass, keep mixed, add K all-fail; seeded split stratified by repo. `selected` = train task set."""
    import shutil
    import tempfile
    from pathlib import Path

    from harnessrl.components.difficulty.select import run_select
    from harnessrl.pipelines.reports import publish

    work = Path(tempfile.mkdtemp(prefix="harnessrl-select-"))
    result = run_select(Path(tasks.path), Path(difficulty.path) / "pass_counts.jsonl", work / "out",
                        k_all_fail=k_all_fail, test_fraction=test_fraction, seed=seed)
    for split, artifact in (("train", selected), ("test", held_out)):
        if Path(artifact.path).exists():
            shutil.rmtree(artifact.path)
        shutil.copytree(work / "out" / split, artifact.path)
    history = Path(difficulty.path) / "history.jsonl"
    if history.is_file():  # the dynamic-sampling history travels with the training task set
        shutil.copyfile(history, Path(selected.path) / "history.jsonl")
    shutil.copyfile(work / "out" / "selection.jsonl", Path(selected.path) / "selection.jsonl")
    publish((work / "out" / "report.md").read_text(), result, report, metrics)
    selected.metadata.update({"tasks": result["train"]})
    held_out.metadata.update({"tasks": result["test"]})
    shutil.rmtree(work, ignore_errors=True)
