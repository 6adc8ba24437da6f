"""Input loading/validation, non-ok policies, dynamic sampling and step planning (no model needed)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnessrl.difficulty.history import PassRateHistory
from harnessrl.io import write_jsonl
from harnessrl.schema import RolloutStatus, Sample, scored_statuses
from harnessrl.train.data import RewardRow, assemble, load_rewards, load_samples
from harnessrl.train.modes import NonOkHandling
from harnessrl.train.round import TrainConfig, plan_round, step_items
from tests.train.support import write_round


def test_round_trip_and_rollout_split(tmp_path, tokenizer):
    sp, rp, samples = write_round(tmp_path, tokenizer)
    loaded = load_samples(sp)
    assert [s.sample_id for s in loaded] == [s.sample_id for s in samples]
    prepared = assemble(loaded, load_rewards(rp))
    split = [r for r in prepared.rollouts if len(r.samples) > 1]
    assert split, "fixture must contain a rollout with several samples"
    assert prepared.excluded == {"status:timeout": 1}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"loss_mask": [0, 1]}, r"row 0 \(sample 's0'\): loss_mask has 2 entries but input_ids has 3"),
        ({"loss_mask": [1, 1, 1]}, r"loss_mask\[0\] is 1"),
        ({"behavior_logprobs": [0.0, 0.5, -1.0]}, "behavior_logprobs of trained tokens"),
        ({"input_ids": [5]}, "input_ids has 1 token"),
    ],
)
def test_bad_sample_rows_are_named(tmp_path, patch, message):
    row = Sample("s0", "r0", "g0", [1, 2, 3], [0, 1, 1], [0.0, -0.5, -1.0]).to_row() | patch
    if "input_ids" in patch:
        row |= {"loss_mask": [0], "behavior_logprobs": [0.0]}
    f = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([row]), f)
    with pytest.raises(ValueError, match=message) as e:
        load_samples(f)
    assert str(f) in str(e.value)


def test_missing_column_and_bad_rewards_are_named(tmp_path):
    f = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist([{"sample_id": "x", "rollout_id": "r"}]), f)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['behavior_logprobs', 'group_id'"):
        load_samples(f)
    r = tmp_path / "rewards.jsonl"
    write_jsonl(r, [{"rollout_id": "a", "reward": 1}, {"rollout_id": "a", "reward": 0}])
    with pytest.raises(ValueError, match=r"rewards.jsonl: row 2: rollout 'a' has a second reward row"):
        load_rewards(r)
    write_jsonl(r, [{"rollout_id": "a", "reward": 1, "status": "exploded"}])
    with pytest.raises(
        ValueError, match=r"row 1 \(rollout 'a'\): status must be one of ok, failed, .*'exploded'"
    ):
        load_rewards(r)
    write_jsonl(r, [{"rollout_id": "a", "reward": "yes"}])
    with pytest.raises(ValueError, match=r"row 1 \(rollout 'a'\): reward must be a finite number"):
        load_rewards(tmp_path)  # a directory: rewards.jsonl is preferred


def _rollout(rid: str, group: str, reward: float | None, status: RolloutStatus = RolloutStatus.OK) -> Sample:
    return Sample(
        f"{rid}-s",
        rid,
        group,
        [1, 2, 3, 4],
        [0, 0, 1, 1],
        [0.0, 0.0, -1.0, -1.0],
        reward=reward,
        rollout_status=status,
    )


def test_nonok_drop_versus_mask_and_missing_rewards():
    samples = [
        _rollout("a", "g", 1.0),
        _rollout("b", "g", 0.0),
        _rollout("c", "g", None, RolloutStatus.TIMEOUT),
        _rollout("d", "g", None),
    ]
    dropped = assemble(samples, None, nonok=NonOkHandling.DROP)
    masked = assemble(samples, None, nonok=NonOkHandling.MASK, mask_reward=0.0)
    assert dropped.excluded == {"status:timeout": 1, "missing_reward": 1}
    assert masked.masked == {"timeout": 1} and masked.excluded == {"missing_reward": 1}
    cfg = TrainConfig()
    plan_d, plan_m = plan_round(dropped, cfg), plan_round(masked, cfg)
    # mask: the timeout counts as a failure in the baseline (a's advantage grows) but is never trained
    assert plan_m.advantages["a"] > plan_d.advantages["a"]
    items, members = step_items(plan_m, plan_m.steps[0], cfg)
    assert {r.rollout_id for r in members} == {"a", "b"} and len(items) == 2
    assert plan_m.counts["rollouts_trained"] == 2


OK, TIMEOUT, FAILED = RolloutStatus.OK, RolloutStatus.TIMEOUT, RolloutStatus.FAILED
INFRA, TOO_LARGE = RolloutStatus.INFRA_ERROR, RolloutStatus.PATCH_TOO_LARGE
DROP, MASK = NonOkHandling.DROP, NonOkHandling.MASK


@pytest.mark.parametrize(
    ("status", "reward", "nonok", "ok_statuses", "placed"),
    [
        # scored (the agent's doing): trained on its reward
        pytest.param(OK, 1.0, DROP, (), (1.0, True), id="ok"),
        pytest.param(OK, None, MASK, (), "missing_reward", id="ok-without-reward"),
        pytest.param(TOO_LARGE, 0.0, DROP, (), (0.0, True), id="patch-too-large-scored-0"),
        # ok_statuses adds to the scored statuses; ok stays one of them
        pytest.param(TIMEOUT, 0.0, DROP, (TIMEOUT,), (0.0, True), id="timeout-added"),
        pytest.param(OK, 1.0, DROP, (TIMEOUT,), (1.0, True), id="ok-kept-beside-an-added-one"),
        # the others: dropped, or (mask) in the baseline with verify's reward, else mask_reward, never trained
        pytest.param(TIMEOUT, 1.0, DROP, (), "status:timeout", id="timeout-dropped"),
        pytest.param(TIMEOUT, 1.0, MASK, (), (1.0, False), id="timeout-masked-graded"),
        pytest.param(FAILED, None, MASK, (), (0.5, False), id="failed-masked-ungraded"),
        # an infrastructure failure is never anyone's 0, not even masked
        pytest.param(INFRA, None, DROP, (), "status:infra_error", id="infra-dropped"),
        pytest.param(INFRA, None, MASK, (), "status:infra_error", id="infra-never-masked"),
    ],
)
def test_where_each_finished_rollout_goes(status, reward, nonok, ok_statuses, placed):
    sample = _rollout("r", "g", None)
    prepared = assemble(
        [sample], {"r": RewardRow(reward, status)}, nonok=nonok, mask_reward=0.5, ok_statuses=ok_statuses
    )
    got = [(r.reward, r.trainable) for r in prepared.rollouts] or list(prepared.excluded)
    assert got == [placed]


def test_an_infrastructure_status_is_never_scored():
    with pytest.raises(
        ValueError, match=r"ok_statuses: infra_error is never scored .* may be added: failed, ok"
    ):
        TrainConfig(ok_statuses=(RolloutStatus.TIMEOUT, RolloutStatus.INFRA_ERROR))
    assert scored_statuses(["timeout"]) == {OK, TOO_LARGE, TIMEOUT}


def test_dynamic_sampling_from_history_and_zero_variance_groups(tmp_path):
    hist = tmp_path / "history.jsonl"
    PassRateHistory(hist).record_round(1, {"easy": (4, 4), "hard": (4, 0), "mixed": (4, 1)})
    samples = [
        _rollout(f"{g}{i}", g, float(i % 2)) for g in ("easy", "hard", "mixed", "new") for i in range(4)
    ]
    samples += [_rollout(f"flat{i}", "flat", 1.0) for i in range(3)]
    cfg = TrainConfig(history=str(hist), history_last_k=2, record_round=2, groups_per_step=2)
    plan = cfg.plan(assemble(samples, None))
    assert plan.counts["groups_skipped_history"] == 2
    assert plan.counts["groups_skipped_zero_variance"] == 1
    assert plan.counts["groups_trained"] == 2
    assert sorted(g for step in plan.steps for g in step) == ["mixed", "new"]
    assert len(plan.steps) == 1  # whole groups per step, never a rollout split across steps


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    from harnessrl.cli import main

    f = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([Sample("s", "r", "g", [1, 2], [1, 1], [0.0, -1.0]).to_row()]), f)
    code = main(
        ["stage", "train", "--samples", str(f), "--out", str(tmp_path / "o"), "--policy", str(tmp_path)]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "not a Hugging Face model directory" in err and "\n" not in err
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    code = main(
        ["stage", "train", "--samples", str(f), "--out", str(tmp_path / "o"), "--policy", str(policy)]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("harnessrl: error: ") and "row 0 (sample 's'): loss_mask[0] is 1" in err
