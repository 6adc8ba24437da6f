"""The `build_environments` component under kfp.local (SubprocessRunner, this env): a task set in, the same
task set out with `image_name` per row and images.jsonl, a report and metrics."""

import json

from harnessrl.io import read_jsonl
from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet
from tests.sandbox.podman_fixtures import requires_podman


@requires_podman
def test_kfp_local_build_environments(synth_taskset, tmp_path):
    from kfp import dsl, local

    from components.build_environments.component import build_environments

    @dsl.pipeline(name="build-environments-only")
    def build_only(tasks_uri: str):
        tasks = dsl.importer(artifact_uri=tasks_uri, artifact_class=dsl.Dataset, reimport=False)
        build_environments(tasks=tasks.output, policy="build")

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        raise_on_error=True,
    )
    build_only(tasks_uri=str(synth_taskset))
    out = next(p for p in (tmp_path / "root").rglob("environments") if p.is_dir())
    rows = TaskSet.open(out).rows()
    assert len(rows) == len(TaskSet.open(synth_taskset).rows())
    assert all(images.image_exists(r["image_name"]) for r in rows)
    assert {r["image_name"] for r in read_jsonl(out / "images.jsonl")} == {r["image_name"] for r in rows}
    metrics = json.loads(next(p for p in (tmp_path / "root").rglob("metrics") if p.is_file()).read_text())
    assert metrics["images_built"] == 1
    assert (
        "Environment images"
        in next(p for p in (tmp_path / "root").rglob("report") if p.is_file()).read_text()
    )
