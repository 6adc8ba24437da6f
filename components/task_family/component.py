"""KFP component `task_family` (thin: the work is in components/task_family/stage.py): the RL loop's training
tasks and the evaluation's held-out tasks — the selected SWE tasks, or a generated family when asked or when
the SWE tasks give the policy no headroom (`family="auto"`). Its return value (output `Output`) is the harness spec the
chosen family's rollouts run under."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def task_family(
    selected: Input[Dataset],
    held_out: Input[Dataset],
    train: Output[Dataset],
    test: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    family: str = "auto",
    n_train: int = 64,
    n_held_out: int = 40,
    kinds: str = "",
    min_words: int = 12,
    seed: int = 0,
    swe_specs_json: str = "",
    family_specs_json: str = "",
) -> str:
    """family: auto | swe | instruction | procedural | search | kernel; kinds (comma-separated) narrow a
    generated family: instruction constraint kinds, procedural datasets, search question kinds; min_words: the
    instruction family's whole one-sentence replies of at least that many words (0: plain requests).
    Returns (output `Output`) the harness spec JSON the chosen family's rollouts run under."""
    import shutil
    import tempfile
    from pathlib import Path

    from components.task_family.stage import Family, run_task_family
    from components.task_family.stage import metrics as flat_metrics
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()
    work = Path(tempfile.mkdtemp(prefix="harnessrl-family-"))
    choice = run_task_family(
        Path(selected.path),
        Path(held_out.path),
        work / "out",
        family=Family(family),
        n_train=n_train,
        n_held_out=n_held_out,
        kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()),
        min_words=min_words,
        seed=seed,
        swe_specs_json=swe_specs_json,
        family_specs_json=family_specs_json,
    )
    for split, artifact in (("train", train), ("test", test)):
        if Path(artifact.path).exists():
            shutil.rmtree(artifact.path)
        shutil.copytree(work / "out" / split, artifact.path)
    publish((work / "out" / "report.md").read_text(), flat_metrics(choice), report, metrics, html=report_html)
    train.metadata.update({"tasks": choice.train, "family": str(choice.family)})
    test.metadata.update({"tasks": choice.test, "family": str(choice.family)})
    shutil.rmtree(work, ignore_errors=True)
    return choice.specs_json
