"""Verify's per-rollout decisions that need no sandbox run: which rollouts are scored, and the reward row."""

from harnessrl.harness.base import RolloutStatus
from harnessrl.verify.grading import VerifyStatus
from harnessrl.verify.rollouts import reward_row, verify_rollout
from harnessrl.verify.verifier import VerifyResult


def _verify(task, tmp_path, status: RolloutStatus) -> tuple[dict, VerifyResult]:
    rollout = {
        "rollout_id": f"{task.iid}__r0",
        "instance_id": task.iid,
        "rollout_status": status,
        "model_patch": "",
    }
    return rollout, verify_rollout(task.taskset, {task.iid: task.row}, rollout, tmp_path, 10.0, None)


def test_a_patch_over_the_cap_scores_zero_and_is_trainable(task, tmp_path):
    rollout, result = _verify(task, tmp_path, RolloutStatus.PATCH_TOO_LARGE)
    assert (result.status, result.reward) == (VerifyStatus.UNRESOLVED, 0.0)
    assert "patch cap" in result.detail
    row = reward_row(rollout, result)
    assert (row["status"], row["reward"], row["rollout_status"]) == ("ok", 0.0, "patch_too_large")


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
