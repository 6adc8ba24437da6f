"""build_environments stage: one environment image per repo, recorded per row; the rows' own images kept by
policy; reruns reuse the cached image."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from components.build_environments.stage import ImagePolicy, ImageSource, run_build_environments
from harnessrl.cli import main
from harnessrl.io import read_jsonl
from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet, write_taskset
from tests.sandbox.podman_fixtures import requires_podman


def test_keep_uses_the_rows_own_images_without_building(synth_taskset, tmp_path, capsys):
    own = {r["instance_id"]: r["image_name"] for r in TaskSet.open(synth_taskset).rows()}
    assert all(own.values())  # synthesized rows name a SWE-smith-style image
    assert (
        main(
            [
                "stage",
                "build-environments",
                "--tasks",
                str(synth_taskset),
                "--out",
                str(tmp_path / "o"),
                "--policy",
                "keep",
            ]
        )
        == 0
    )
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["images_built"] == 0 and metrics["rows_with_own_image"] == len(own)
    rows = TaskSet.open(tmp_path / "o" / "tasks").rows()
    assert {r["instance_id"]: r["image_name"] for r in rows} == own
    assert {r["source"] for r in read_jsonl(tmp_path / "o" / "images.jsonl")} == {ImageSource.TASK}


def test_an_unknown_policy_is_refused(synth_taskset, tmp_path):
    with pytest.raises(SystemExit):
        main(
            [
                "stage",
                "build-environments",
                "--tasks",
                str(synth_taskset),
                "--out",
                str(tmp_path),
                "--policy",
                "x",
            ]
        )


@requires_podman
def test_build_records_one_image_per_repo_and_reruns_reuse_it(synth_taskset, tmp_path):
    metrics = run_build_environments(synth_taskset, tmp_path / "a", ImagePolicy.BUILD)
    rows = TaskSet.open(tmp_path / "a" / "tasks").rows()
    names = {r["image_name"] for r in rows}
    assert metrics["images_built"] == metrics["repos"] == len(names) == 1 and metrics["tasks"] == len(rows)
    (image,) = names
    assert image.startswith(images.ENV_IMAGE_PREFIX) and images.image_exists(image)
    label = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{images.ENV_LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(label)["repo"] == rows[0]["repo"]
    manifest = json.loads((tmp_path / "a" / "tasks" / "manifest.json").read_text())
    assert manifest["environment_images"] == {rows[0]["repo"]: image}
    started = time.monotonic()
    run_build_environments(synth_taskset, tmp_path / "b", ImagePolicy.BUILD)
    assert time.monotonic() - started < 30  # cached: no rebuild
    assert (tmp_path / "b" / "tasks" / "tasks.jsonl").read_text() == (
        tmp_path / "a" / "tasks" / "tasks.jsonl"
    ).read_text()


@requires_podman
def test_auto_keeps_an_own_image_only_when_it_exists_here(synth_taskset, tmp_path):
    rows = TaskSet.open(synth_taskset).rows()
    built = run_build_environments(synth_taskset, tmp_path / "a", ImagePolicy.AUTO)
    assert built["rows_with_own_image"] == 0  # the rows' swesmith.* images are not in the local store
    image = TaskSet.open(tmp_path / "a" / "tasks").rows()[0]["image_name"]
    own = f"localhost/harnessrl-test-own-{rows[0]['image_name'].rsplit('.', 1)[-1]}:1"
    subprocess.run(["podman", "tag", image, own], check=True)
    try:
        first = dict(rows[0], image_name=own)
        retagged = tmp_path / "own"
        write_taskset(
            retagged,
            [first, *rows[1:]],
            {r["repo"]: TaskSet.open(synth_taskset).bundle(r["repo"]) for r in rows},
            source="test",
        )
        metrics = run_build_environments(retagged, tmp_path / "b", ImagePolicy.AUTO)
    finally:
        subprocess.run(["podman", "untag", image, own], check=True)
    got = {r["instance_id"]: r["image_name"] for r in TaskSet.open(tmp_path / "b" / "tasks").rows()}
    assert got[first["instance_id"]] == own and metrics["rows_with_own_image"] == 1
    assert all(v == image for k, v in got.items() if k != first["instance_id"])
