"""The RL loop's task-set workload grades each rollout in the sandbox its harness spec names: a podman spec's
rollout is verified in a fresh container of the task's image, as it ran, not on the host (docs/rl.md).

Real rollouts (a scripted engine behind the real gateway, the ReAct harness in a podman container and in
bubblewrap) and real verifications; skipped with the reason where podman cannot run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rl.workloads import GatewayAccess, RolloutPlan, TaskSetWorkload
from harnessrl.rollout.model_server import ModelServer, ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox import images
from harnessrl.schema import RolloutStatus
from tests.sandbox.podman_fixtures import requires_podman

pytestmark = [requires_podman, pytest.mark.slow]

IMAGE_ONLY = "harnessrl_image_only"  # a module the task's image holds and the host's environment lacks


def _image_with_module(base: str, scratch: Path) -> str:
    """`base` (a task's environment image) plus the IMAGE_ONLY module in its environment."""
    tag = f"{base.rsplit(':', 1)[0]}-image-only:test"
    scratch.mkdir()
    write = f"pathlib.Path(sysconfig.get_paths()['purelib'], '{IMAGE_ONLY}.py').write_text('MARK = 1')"
    user = images.podman("inspect", "--format", "{{.Config.User}}", base).stdout.strip() or "root"
    (scratch / "Containerfile").write_text(
        f'FROM {base}\nUSER root\nRUN python -c "import pathlib, sysconfig; {write}"\nUSER {user}\n'
    )
    images.podman("build", "--pull=never", "-t", tag, str(scratch), timeout=300)
    return tag


def _call(name: str, **arguments: str) -> dict:
    return {"text": f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"}


def test_the_loop_grades_a_rollout_in_the_sandbox_its_spec_names(podman_task, fast_engine, tmp_path):
    """One group of two rollouts of the same fix, the first under a podman spec, the second under a bubblewrap
    one. The fix imports a module only the task's image has: graded in the image's container it is resolved;
    graded on the host (bubblewrap), its import fails. Grading in bubblewrap whatever the spec said scored
    both 0."""
    image = _image_with_module(podman_task.row["image_name"], tmp_path / "image")
    tasks = Path(shutil.copytree(podman_task.taskset.root, tmp_path / "tasks"))
    rows = [
        {**r, "image_name": image} if r["instance_id"] == podman_task.iid else r
        for r in read_jsonl(tasks / "tasks.jsonl")
    ]
    write_jsonl(tasks / "tasks.jsonl", rows)
    gold = podman_task.workspace(tmp_path / "gold")
    podman_task.apply_gold(gold)
    module = podman_task.module()
    fix = f"import {IMAGE_ONLY}\n" + (gold / module).read_text()
    engine = fast_engine(
        [_call("str_replace_editor", command="create", path=module, file_text=fix), _call("submit")]
    )
    specs = parse_specs(
        [{"sandbox": sandbox, "limits": {"turns": 4}} for sandbox in ("podman", "bubblewrap")]
    )
    workload = TaskSetWorkload(tasks, specs, group_size=2, work=tmp_path / "work")
    group = f"{podman_task.iid}@g0"
    with ModelServer(ModelSource(engine_url=engine.base_url), tmp_path / "journal") as server:
        gateway = GatewayAccess(server.gateway.base_url, server.admin_token)
        done = [
            workload.run(RolloutPlan(f"{group}__r{k}", group, podman_task.iid, k, 0, k), gateway)
            for k in (0, 1)
        ]
    assert [d.row.sandbox if d.row else None for d in done] == ["podman", "bubblewrap"]
    assert [(d.status, d.reward) for d in done] == [(RolloutStatus.OK, 1.0), (RolloutStatus.OK, 0.0)], [
        d.detail for d in done
    ]
