"""KFP component `select`: the training task set (mixed + K all-fail) and the held-out split."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def select(
    tasks: Input[Dataset],
    difficulty: Input[Dataset],
    selected: Output[Dataset],
    held_out: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    k_all_fail: int = 0,
    test_fraction: float = 0.1,
    seed: int = 0,
):
    """Drop all-pass, keep mixed, add K all-fail; seeded split stratified by repo. `selected` = train task set."""
    import shutil
    import tempfile
    from pathlib import Path

    from components.select_tasks.stage import run_select
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()

    work = Path(tempfile.mkdtemp(prefix="harnessrl-select-"))
    result = run_select(
        Path(tasks.path),
        Path(difficulty.path) / "pass_counts.jsonl",
        work / "out",
        k_all_fail=k_all_fail,
        test_fraction=test_fraction,
        seed=seed,
    )
    for split, artifact in (("train", selected), ("test", held_out)):
        if Path(artifact.path).exists():
            shutil.rmtree(artifact.path)
        shutil.copytree(work / "out" / split, artifact.path)
    history = Path(difficulty.path) / "history.jsonl"
    if history.is_file():  # the dynamic-sampling history travels with the training task set
        shutil.copyfile(history, Path(selected.path) / "history.jsonl")
    shutil.copyfile(work / "out" / "selection.jsonl", Path(selected.path) / "selection.jsonl")
    publish((work / "out" / "report.md").read_text(), result, report, metrics, html=report_html)
    selected.metadata.update({"tasks": result["train"]})
    held_out.metadata.update({"tasks": result["test"]})
    shutil.rmtree(work, ignore_errors=True)
