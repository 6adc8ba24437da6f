"""End to end on the real tiny model (SmolLM2-135M, CPU): estimate_difficulty (generate with both harnesses in
two sandbox settings, mixed in one run, then verify) and select."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from components.estimate_difficulty.stage import run_estimate
from components.select_tasks.stage import run_select
from harnessrl.difficulty.history import PassRateHistory
from harnessrl.io import read_jsonl
from harnessrl.rollout.specs import parse_specs
from harnessrl.taskset import TaskSet
from tests.support.fixtures import requires_bwrap

SPECS = [
    {
        "name": "react-bwrap",
        "harness": "react",
        "sandbox": "bubblewrap",
        "limits": {"turns": 2, "tokens": 4096, "wall_s": 900},
        "options": {"max_tokens_per_turn": 12, "min_tokens_per_turn": 8, "on_no_tool_call": "nudge"},
    },
    {
        "name": "mini-strict",
        "harness": "mini-swe-agent",
        "sandbox": "bubblewrap-strict",
        "limits": {"turns": 1, "wall_s": 900, "memory_mb": 1024},
        "options": {"max_tokens_per_turn": 12, "model_retries": 1},
    },
]


@requires_bwrap
@pytest.mark.slow
def test_estimate_and_select_with_both_harnesses_on_the_tiny_model(synth_taskset, tmp_path):
    first = TaskSet.open(synth_taskset).rows()[0]["instance_id"]
    est = tmp_path / "estimates"
    metrics = run_estimate(synth_taskset, est, n=2, specs=parse_specs(SPECS), concurrency=2, max_tasks=1)
    rows = list(read_jsonl(est / "rollouts" / "rollouts.jsonl"))
    assert [(r["instance_id"], r["harness"], r["sandbox"]) for r in rows] == [
        (first, "react", "bubblewrap"),
        (first, "mini-swe-agent", "bubblewrap-strict"),
    ]
    records = pq.read_table(est / "rollouts" / "records.parquet").to_pylist()
    samples = pq.read_table(est / "rollouts" / "samples.parquet").to_pylist()
    for r in rows:
        assert r["rollout_status"] == "ok", r["error"]
        assert r["turns"] >= 1
        calls = [c for c in records if c["rollout_id"] == r["rollout_id"]]
        assert len(calls) == r["turns"] == r["gateway"]["calls"]  # every model call is in the records
        mine = [s for s in samples if s["rollout_id"] == r["rollout_id"]]
        calls.sort(key=lambda c: c["started_at"])
        for i, c in enumerate(calls):
            assert 0 < len(c["completion_ids"]) <= 16 and len(c["completion_logprobs"]) == len(
                c["completion_ids"]
            )
            later = [d for d in calls[i + 1 :] if d["chain_id"] == c["chain_id"]]
            if later and later[0]["op"] == "rollback":
                continue  # the harness discarded this response: its tokens left the chain by design
            # exact token ids: the call's prompt + sampled ids sit verbatim in a sample, sampled ids trainable
            seq = c["prompt_ids"] + c["completion_ids"]
            n = len(c["prompt_ids"])
            holders = [s for s in mine if s["input_ids"][: len(seq)] == seq]
            assert holders, f"call {c['call_id']} ({c['op']}) not found verbatim in any sample"
            assert any(
                s["loss_mask"][n : len(seq)] == [1] * len(c["completion_ids"])
                and s["behavior_logprobs"][n : len(seq)] == pytest.approx(c["completion_logprobs"])
                for s in holders
            )
    rewards = {r["rollout_id"]: r for r in read_jsonl(est / "verified" / "rewards.jsonl")}
    assert set(rewards) == {r["rollout_id"] for r in rows}
    assert all(v["status"] == "ok" and v["reward"] in (0.0, 1.0) for v in rewards.values())
    counts = list(read_jsonl(est / "pass_counts.jsonl"))
    assert counts == [{**counts[0], "instance_id": first, "n": 2, "n_valid": 2}]
    assert PassRateHistory(est / "history.jsonl").rows[0].n == 2
    assert metrics["rollouts"] == 2 and (est / "pass_rate_hist.png").stat().st_size > 2000
    # the in-process engine's stats reach the generate report (prefill/decode seconds, prefix cache hits)
    engine = json.loads((est / "rollouts" / "metrics.json").read_text())["engine"]
    assert (
        engine["requests"] >= 3
        and engine["prefill_s_per_request"] > 0
        and engine["prefix_cache_hit_rate"] > 0
    )

    sel = run_select(
        synth_taskset,
        est / "pass_counts.jsonl",
        tmp_path / "selected",
        k_all_fail=1,
        test_fraction=0.0,
        seed=0,
    )
    decision = json.loads((tmp_path / "selected" / "selection.jsonl").read_text().splitlines()[0])
    if decision["class"] == "all_pass":
        assert sel["train"] == 0
    else:  # the tiny model fails (all_fail, kept as one of K=1) or is mixed: either way it is kept
        assert (
            sel["train"] == 1
            and TaskSet.open(tmp_path / "selected" / "train").rows()[0]["instance_id"] == first
        )
