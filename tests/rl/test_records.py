"""The RL loop's settings and records as files hold them: configs in the layout of earlier versions still read,
a run's settings hash to the identities earlier versions computed (so their checkpoints still resume), and a
step record reads back as it was written — rows of earlier versions included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.gateway.replies import ReplyFigures
from harnessrl.rl.config import RLConfig, RLInputs, current_layout
from harnessrl.rl.modes import StepOutcome
from harnessrl.rl.records import Collected, EngineRates, StepRecord, Update, summarize
from harnessrl.rl.run import _digest
from harnessrl.train.trainer import STEP_METRICS, StepMetrics

# identities of these settings as a270d73 (before the update settings were shared) computed them
EARLIER_IDENTITIES = [
    ({}, "f6b8303324c02581"),
    (
        {
            "mode": "sync",
            "steps": 3,
            "save_every": 1,
            "train": {"estimator": "rloo", "train": {"optim": {"lr": 1e-4}}},
        },
        "1b5c20b511c8ff3d",
    ),
]


@pytest.mark.parametrize(("config", "identity"), EARLIER_IDENTITIES, ids=["defaults", "nested-rloo"])
def test_settings_hash_to_the_identities_of_earlier_versions(config: dict, identity: str):
    cfg = RLConfig.from_dict(config)
    assert _digest(json.dumps(cfg.hashed_settings(), sort_keys=True, default=str).encode()) == identity


def test_a_changed_update_setting_changes_the_identity():
    base = RLConfig().hashed_settings()
    assert RLConfig.from_dict({"estimator": "rloo"}).hashed_settings() != base
    assert RLConfig.from_dict({"train": {"optim": {"lr": 3e-6}}}).hashed_settings() != base
    lora = RLConfig.from_dict({"train": {"lora": {"rank": 8}}}).hashed_settings()
    assert lora != base  # adapters: another run
    assert RLConfig.from_dict({"steps": 99, "save_every": 3}).hashed_settings() == base  # unhashed
    # how a step is computed, not what: a run resumes with a shared prefix packed once or per sequence
    assert RLConfig.from_dict({"train": {"share_prefixes": False}}).hashed_settings() == base


SPEC = {"harness": "chat", "tools": [], "reward": "instruction_fraction", "limits": {"tokens": 8}}
# the same spec in other words: keys reordered, indented, the default limits spelled out, another name
SAME_SPEC = {"limits": {"wall_s": 600, "tokens": 8, "turns": 20}, "name": "mine", **SPEC}


@pytest.mark.parametrize(
    ("specs", "said"),
    [
        pytest.param([SAME_SPEC], "", id="reformatted"),
        pytest.param([{**SPEC, "reward": "instruction_strict"}], "the specs differ (reward)", id="reward"),
        pytest.param(
            [{**SPEC, "limits": {"tokens": 16}, "options": {"temperature": 0.5}}],
            "the specs differ (limits, options)",
            id="limits-and-options",
        ),
        pytest.param([SPEC, SPEC], "the specs differ (" + ", ".join(sorted(
            ["environments", "harness", "limits", "network", "options", "reward", "sandbox", "tools", "train_chains"]
        )) + ")", id="one-more-spec"),
        pytest.param(None, "the specs differ (" + ", ".join(sorted(
            ["environments", "harness", "limits", "network", "options", "reward", "sandbox", "tools", "train_chains"]
        )) + ")", id="none"),
    ],
)  # fmt: skip
def test_a_runs_identity_holds_what_its_specs_say(tmp_path: Path, specs: list | None, said: str):
    """Against a run under SPEC (a file): what the specs say counts, not how or where a file says it, and a
    change is named by field."""
    from harnessrl.rl.modes import WorkloadKind
    from harnessrl.rl.run import make_workload, run_identity
    from harnessrl.taskset import write_taskset

    row = {"instance_id": "if-1", "environment": "instruction", "problem_statement": "Describe a river.",
           "constraints": [{"kind": "no_commas", "args": {}}]}  # fmt: skip
    tasks = write_taskset(tmp_path / "tasks", [row], {}, "test").root
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    cfg = RLConfig()

    def identity(given: list | None, name: str):
        path = None
        if given is not None:
            path = tmp_path / name
            path.write_text(json.dumps(given, indent=2 if name == "b.json" else None))
        inputs = RLInputs(WorkloadKind.SWE, tasks, tmp_path / "out", specs=path)
        return run_identity(cfg, inputs, policy, make_workload(inputs, cfg, tmp_path / "work"))

    before, now = identity([SPEC], "a.json"), identity(specs, "b.json")
    assert now.differences(before.to_meta()) == (said or "its fingerprint differs")
    assert (now.digest == before.digest) == (not said)


def test_a_run_without_specs_keeps_the_identity_of_earlier_versions(tmp_path: Path):
    from harnessrl.rl.modes import WorkloadKind
    from harnessrl.rl.run import run_identity
    from harnessrl.rl.workloads import PromptWorkload
    from tests.rl.support import write_prompt_tasks

    tasks = write_prompt_tasks(tmp_path / "tasks.jsonl")
    policy = tmp_path / "policy"
    policy.mkdir()
    inputs = RLInputs(WorkloadKind.PROMPT, tasks, tmp_path / "out")
    parts = run_identity(RLConfig(), inputs, policy, PromptWorkload(tasks)).parts
    assert set(parts) == {"settings", "policy", "tasks", "workload"}
    assert parts["workload"] == "af58d0c8357138db"  # as earlier versions hashed ["prompt", str(None)]


def test_the_nested_layout_of_earlier_versions_reads_as_the_current_one():
    old = {
        "mode": "sync",
        "train": {"estimator": "rloo", "threads": 1, "epochs": 3, "train": {"optim": {"lr": 2e-5}}},
    }
    assert current_layout(old) == {
        "mode": "sync",
        "estimator": "rloo",
        "threads": 1,
        "train": {"optim": {"lr": 2e-5}},
    }
    cfg = RLConfig.from_dict(old)
    assert cfg.estimator == "rloo" and cfg.threads == 1 and cfg.train.optim.lr == 2e-5
    current = {"estimator": "rloo", "train": {"optim": {"lr": 2e-5}, "seed": 4}}
    assert current_layout(current) == current


def test_an_unknown_field_is_refused_by_name():
    with pytest.raises(ValueError, match=r"rl config: unknown field\(s\) stepz; known: .*steps"):
        RLConfig.from_dict({"stepz": 3})


def _trained(step: int) -> StepRecord:
    figures = StepMetrics(**{k: float(i) for i, k in enumerate(STEP_METRICS)})  # pyright: ignore[reportArgumentType]
    update = Update(figures, 1.5, 0.25, 0.5, 8, 2, 0.5, 1, 3, 0)
    collected = Collected(groups_zero_variance=1, tokens_generated=40, wait_s=2.0, groups_discarded=["t@g3"])
    collected.add_rewards([0.0, 1.0, 1.0, 0.0])
    return StepRecord(
        step,
        "colocated",
        StepOutcome.TRAINED,
        step,
        ["t@g1", "t@g2"],
        collected,
        update,
        0.2,
        0.4,
        20.0,
        3.0,
        3.0 * step,
    )


def test_a_step_record_reads_back_as_written():
    trained = _trained(1)
    idle = StepRecord(
        2,
        "colocated",
        StepOutcome.NO_SIGNAL,
        1,
        [],
        Collected(groups_skipped=["x@g5"]),
        None,
        0.0,
        None,
        0.0,
        1.0,
        4.0,
    )
    for record in (trained, idle):
        row = json.loads(json.dumps(record.row()))
        assert StepRecord.from_row(row).row() == record.row()
    row = trained.row()
    assert row["loss"] == 0.0 and row["reward_all_mean"] == 0.5 and row["rollouts_finished"] == 4
    assert "step" in row and row["step"] == 1  # the loop's step, not the trainer's own counter
    assert idle.row()["groups_trained"] == 0 and idle.row()["groups_skipped_dynamic"] == 1


def test_a_row_of_an_earlier_version_reads():
    row = {  # as a270d73 wrote a trained step (keys it had; some this version no longer writes)
        "step": 3, "mode": "sync", "groups": ["a@g0"], "loss": 0.12, "grad_norm": 0.5, "tokens_per_s": 900.0,
        "train_s": 1.0, "reward_mean": 0.5, "reward_std": 0.5, "rollouts_trained": 4, "groups_trained": 1,
        "staleness_mean": 0.0, "staleness_max": 0, "partial_rollouts": 0, "excluded": 0,
        "groups_zero_variance": 2, "groups_stale_dropped": 0, "reward_all_mean": 0.25, "rollouts_finished": 12,
        "tokens_generated": 300, "wait_s": 5.0, "pause_s": 0.0, "lent_s": 0.0, "role_switches": 0,
        "groups_discarded": ["b@g1", "c@g2"], "outcome": "trained", "version": 3, "weight_sync_s": 0.3,
        "groups_skipped_dynamic": 0, "groups_skipped": [], "dynamic_sampling_exhausted": 0,
        "engine_idle_frac": None, "gen_tokens_per_s": 30.0, "step_s": 10.0, "wall_s": 31.0,
    }  # fmt: skip
    record = StepRecord.from_row(row)
    assert record.loss == 0.12 and record.reward_mean == 0.5 and record.collected.reward_all_mean == 0.25
    assert record.update is not None and record.update.trainer["tokens_per_s"] == 900.0
    assert record.replies == ReplyFigures() and record.row()["mean_reply_tokens"] is None  # not measured then
    assert {k: v for k, v in record.row().items() if k in row} == {
        k: v for k, v in row.items() if k in record.row()
    }


def test_the_summary_is_computed_from_the_records():
    records = [_trained(1), _trained(2)]
    summary = summarize(records, "colocated", 6, 7.0, EngineRates(40.0, 400.0), 1)
    assert summary.steps == summary.steps_trained == 2 and summary.version == 2
    assert (
        summary.groups_trained == 4 and summary.groups_zero_variance == 2 and summary.reward_all_mean == 0.5
    )
    assert summary.loss_last == 0.0 and summary.wall_s == 6.0 and summary.decode_tokens_per_s == 40.0
    assert json.loads(json.dumps(summary.to_dict()))["train_tokens_per_s"] == float(
        STEP_METRICS.index("tokens_per_s")
    )


def test_samples_per_rollout_are_in_the_row_and_the_summary():
    """A CLI agent's side calls are samples of their own: a step's row says how many of its finished rollouts
    stayed one sample and the mean samples per rollout; they read back, and the summary weighs them over the
    run (`null` when no rollout had a sample)."""
    step = _trained(1)
    step.collected.add_samples(["a", "b", "b", "b", "c"])  # one sample, three, one
    row = json.loads(json.dumps(step.row()))
    assert (row["sampled_rollouts"], row["single_sample_share"], row["samples_per_rollout_mean"]) == (
        3,
        2 / 3,
        5 / 3,
    )
    assert StepRecord.from_row(row).row() == step.row()
    other = _trained(2)
    other.collected.add_samples(["d"])
    summary = summarize([step, other], "sync", 2, 1.0, EngineRates(), 1)
    assert (summary.single_sample_share, summary.samples_per_rollout_mean) == (3 / 4, 6 / 4)
    assert _trained(3).row()["single_sample_share"] is None
    assert summarize([_trained(3)], "sync", 1, 1.0, EngineRates(), 1).samples_per_rollout_mean is None


def test_reply_figures_are_in_the_row_and_the_summary_holds_the_first_and_last_measured(tmp_path: Path):
    """What the replies looked like: in each step's row (and so its TensorBoard scalars and its line), read
    back; the summary takes the first and the last step that measured them (a step without a model call has
    none); the report shows them."""
    from harnessrl.rl.metrics import echo_line
    from harnessrl.rl.report import write_report

    first, quiet, last = _trained(1), _trained(2), _trained(3)
    first.replies = ReplyFigures(mean_reply_tokens=120.0, length_finish_share=0.5, distinct_2=0.6)
    last.replies = ReplyFigures(mean_reply_tokens=30.0, length_finish_share=0.0, distinct_2=0.9)
    row = json.loads(json.dumps(first.row()))
    assert (row["mean_reply_tokens"], row["length_finish_share"], row["distinct_2"]) == (120.0, 0.5, 0.6)
    assert StepRecord.from_row(row).replies == first.replies
    assert StepRecord.from_row(row).row() == first.row()
    assert "mean_reply_tokens=120 length_finish_share=0.5 distinct_2=0.6" in echo_line(row)
    summary = summarize([first, quiet, last], "colocated", 3, 9.0, EngineRates(), 1)
    assert (summary.mean_reply_tokens_first, summary.mean_reply_tokens_last) == (120.0, 30.0)
    assert (summary.length_finish_share_first, summary.length_finish_share_last) == (0.5, 0.0)
    assert (summary.distinct_2_first, summary.distinct_2_last) == (0.6, 0.9)
    none = summarize([quiet], "sync", 1, 1.0, EngineRates(), 1)
    assert none.mean_reply_tokens_first is None and none.distinct_2_last is None

    report = write_report(tmp_path, summary, [first, quiet, last], RLConfig()).read_text()
    assert "| `mean_reply_tokens_first` | 120 |" in report and "| `distinct_2_last` | 0.9 |" in report
    assert "| mean_reply_tokens | length_finish_share | distinct_2 |" in report
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
