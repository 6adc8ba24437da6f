"""KFP component `build-environments`: the task set with an environment image per row (`image_name`)."""

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.common import component


@component
def build_environments(
    tasks: Input[Dataset],
    environments: Output[Dataset],
    report: Output[Markdown],
    report_html: Output[HTML],
    metrics: Output[Metrics],
    policy: str = "auto",
):
    """Per repo, an image with its deps (podman, cached); each row's `image_name` names the image to run in."""
    import shutil
    import tempfile
    from pathlib import Path

    from components.build_environments.stage import ImagePolicy, run_build_environments
    from harnessrl.choices import parse_choice
    from harnessrl.logs import configure_logging
    from harnessrl.reports import publish

    configure_logging()
    work = Path(tempfile.mkdtemp(prefix="harnessrl-envs-"))
    result = run_build_environments(
        Path(tasks.path), work / "out", parse_choice(ImagePolicy, policy, "policy")
    )
    if Path(environments.path).exists():
        shutil.rmtree(environments.path)
    shutil.copytree(work / "out" / "tasks", environments.path)
    shutil.copyfile(work / "out" / "images.jsonl", Path(environments.path) / "images.jsonl")
    publish((work / "out" / "report.md").read_text(), result, report, metrics, html=report_html)
    environments.metadata.update({"tasks": result["tasks"], "images_built": result["images_built"]})
    shutil.rmtree(work, ignore_errors=True)
