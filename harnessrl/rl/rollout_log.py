"""What the RL loop's rollouts did, kept for people: a row per rollout per step, and the report's trajectories.

- `rollouts/step-NNNNNN.jsonl`: one row per rollout of every group the step finished with — trained on, or
  discarded (all rewards equal, or too stale), its `fate` says which — with ids, policy version, status, reward
  and its parts, the episode's counts and how it ended; written atomically when the step is recorded (a
  resumed run rewrites the steps it repeats, so the directory holds each step once).
- `trajectory_section`: the RL report's trajectory view (rollout/trajectories.py) of a few rollouts of the last
  step — the first, the best and worst reward, the worst-ended — decoded from the gateway journal with the
  policy's tokenizer: each model call's context apart from the tokens the policy sampled and trained on, the
  chain tree (subagents, compaction), rollbacks and what they discarded, the reward and its parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.gateway.journal import read_journal
from harnessrl.gateway.records import CallRecord
from harnessrl.gateway.samples import call_rows
from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rl.groups import Group
from harnessrl.rl.modes import GroupFate
from harnessrl.rl.workloads import Finished
from harnessrl.rollout.trajectories import Decode, gateway_stats, pick_rollouts, trajectory_markdown

DIR = "rollouts"
EPISODE_FIELDS = (
    "spec_name",
    "harness",
    "environment",
    "finish_reason",
    "error",
    "turns",
    "tool_calls",
    "compactions",
    "model_s",
    "tool_s",
)


def rollout_row(done: Finished, step: int, version: int, fate: GroupFate) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step": step,
        "version": version,
        "fate": str(fate),
        "rollout_id": done.rollout_id,
        "group_id": done.group_id,
        "task_id": done.task_id,
        "rollout_status": str(done.status),
        "reward": done.reward,
        "reward_parts": dict(done.reward_parts),
        "detail": done.detail,
        "wall_s": round(done.wall_s, 3),
    }
    if done.row is not None:
        for name in EPISODE_FIELDS:
            value = getattr(done.row, name)
            row[name] = str(value) if value is not None and not isinstance(value, int | float) else value
    return row


def step_path(out: Path, step: int) -> Path:
    return out / DIR / f"step-{step:06d}.jsonl"


def write_step_rollouts(
    out: Path, step: int, version: int, trained: list[Group], discarded: list[tuple[Group, GroupFate]]
) -> Path:
    """The step's rollouts (`version`: the policy version after the step, as in steps.jsonl)."""
    fates = [(g, GroupFate.TRAINED) for g in trained] + discarded
    rows = [rollout_row(r, step, version, fate) for g, fate in fates for r in g.rollouts]
    write_jsonl(step_path(out, step), rows)
    return step_path(out, step)


def read_step_rollouts(out: Path, step: int) -> list[dict[str, Any]]:
    path = step_path(out, step)
    return list(read_jsonl(path)) if path.is_file() else []


def journal_calls(journal: Path, rollout_ids: set[str]) -> list[dict[str, Any]]:
    """The model calls of these rollouts (full prompts rebuilt from the journal's deltas). Only their records
    are kept while reading: a chain never leaves its rollout, so the rest of a long run's journal is skipped."""
    records = (
        r
        for r in read_journal(journal, salvage=True)
        if isinstance(r, CallRecord) and r.rollout_id in rollout_ids
    )
    return call_rows(records)


def trajectory_section(rows: list[dict[str, Any]], journal: Path, decode: Decode) -> str:
    """The `## Trajectories` Markdown of a few of `rows` (one step's rollout rows)."""
    if not rows:
        return "## Trajectories\n\nThe last step finished no group of rollouts: there is nothing to show.\n"
    calls = journal_calls(journal, {r["rollout_id"] for r in rows})
    stats = gateway_stats(calls)
    shown = [{**r, "gateway": stats.get(r["rollout_id"], {})} for r in rows]
    rewards = {r["rollout_id"]: r for r in rows}
    picked = [rid for rid, _ in pick_rollouts(shown, rewards)]
    if not picked:
        return (
            f"## Trajectories\n\nNone of the last step's {len(rows)} rollouts made a model call the gateway "
            "journal still holds.\n"
        )
    return trajectory_markdown(shown, [c for c in calls if c["rollout_id"] in picked], decode, rewards)
