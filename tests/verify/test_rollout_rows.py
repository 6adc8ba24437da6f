"""Verify's per-rollout decisions that need no sandbox run: which rollouts are scored, and the reward row."""

import pytest

from harnessrl.schema import RolloutStatus
from harnessrl.verify.grading import VerifyStatus
from harnessrl.verify.rollouts import reward_row, verify_rollout
from harnessrl.verify.verifier import VerifyResult


def _verify(task, tmp_path, status: RolloutStatus, patch: str = "") -> tuple[dict, VerifyResult]:
    rollout = {
        "rollout_id": f"{task.iid}__r0",
        "instance_id": task.iid,
        "rollout_status": status,
        "model_patch": patch,
    }
    return rollout, verify_rollout(task.taskset, {task.iid: task.row}, rollout, tmp_path, 10.0, None)


def test_a_patch_over_the_cap_scores_zero_and_is_trainable(task, tmp_path):
    rollout, result = _verify(task, tmp_path, RolloutStatus.PATCH_TOO_LARGE)
    assert (result.status, result.reward) == (VerifyStatus.UNRESOLVED, 0.0)
    assert "patch cap" in result.detail
    row = reward_row(rollout, result)
    assert (row["status"], row["reward"], row["rollout_status"]) == ("ok", 0.0, "patch_too_large")


ROOT_CONFTEST_ONLY = """diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import os
"""


@pytest.mark.parametrize(("patch", "why"), [("", "no changes"), (ROOT_CONFTEST_ONLY, "dropped")])
def test_an_empty_patch_scores_zero_without_a_test_run(task, tmp_path, patch, why):
    """Nothing of the agent's reaches the graded tree (no diff, or only files the filter drops): the task's
    unpatched state, where its FAIL_TO_PASS tests fail by definition, so no sandbox is started."""
    rollout, result = _verify(task, tmp_path, RolloutStatus.OK, patch)
    assert (result.status, result.reward, result.f2p_fraction) == (VerifyStatus.UNRESOLVED, 0.0, 0.0)
    assert why in result.detail and "without running tests" in result.detail
    assert result.test_log == "" and "tests_s" not in result.timings
    assert [d["path"] for d in result.dropped] == (["conftest.py"] if patch else [])
    assert (reward_row(rollout, result)["status"], result.resolved) == ("ok", False)


def test_an_infra_error_rollout_is_not_graded(task, tmp_path):
    rollout, result = _verify(task, tmp_path, RolloutStatus.INFRA_ERROR)
    assert result.status is VerifyStatus.INFRA_ERROR
    assert reward_row(rollout, result)["reward"] is None


def test_a_failed_rollout_keeps_its_status_for_the_trainer():
    rollout = {"rollout_id": "t__r1", "instance_id": "t", "rollout_status": RolloutStatus.FAILED}
    row = reward_row(rollout, VerifyResult("t", VerifyStatus.UNRESOLVED, reward=0.0))
    assert (row["status"], row["reward"]) == ("failed", 0.0)


def test_logs_of_ids_that_differ_only_in_unsafe_characters_do_not_collide(task, tmp_path):
    import json

    from harnessrl.verify.rollouts import run_verify

    ids = [f"{task.iid}/r0", f"{task.iid}_r0", f"../{task.iid}"]
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    rows = [{"rollout_id": i, "instance_id": task.iid, "rollout_status": "infra_error"} for i in ids]
    (rollouts / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_verify(task.taskset.root, rollouts, tmp_path / "out", workers=1)
    logs = sorted(p.name for p in (tmp_path / "out" / "logs").iterdir())
    assert len(logs) == len(ids) and not any(name.startswith(".") or "/" in name for name in logs)


@pytest.mark.parametrize(
    ("spec", "kind", "network"),
    [
        pytest.param({"sandbox": "podman", "network": "pypi"}, "podman", "pypi", id="podman-with-network"),
        pytest.param({"sandbox": "kubernetes"}, "kubernetes", None, id="kubernetes"),
        pytest.param({"sandbox": "bubblewrap"}, "bubblewrap", None, id="bubblewrap"),
        pytest.param({"sandbox": "local"}, "bubblewrap", None, id="local-is-verified-sandboxed"),
        pytest.param(None, "bubblewrap", None, id="no-spec"),
    ],
)
def test_a_rollout_is_verified_where_its_spec_ran_it(spec, kind, network):
    """run_verify(sandbox=None), as the difficulty estimate and the evaluation call it: each rollout in its own
    spec's sandbox (a podman rollout in a fresh container of its task's image), never bubblewrap by default."""
    from harnessrl.verify.rollouts import rollout_sandbox

    choice = rollout_sandbox({"rollout_id": "r", "spec": spec} if spec else {"rollout_id": "r"})
    assert (str(choice.kind), choice.network) == (kind, network)
