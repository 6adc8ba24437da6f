"""Generate-stage outputs after the rollouts: gateway export -> records/samples, metrics, plots, report."""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.io import atomic_write_bytes, atomic_write_text
from harnessrl.rollout.config import FailedSamples
from harnessrl.rollout.trajectories import (
    Decode,
    gateway_stats,
    pick_rollouts,
    read_calls,
    trajectory_markdown,
)
from harnessrl.schema import RolloutStatus


def export_and_summarize(
    out: Path,
    rows: list[dict],
    gateway_metrics: dict,
    wall_s: float,
    failed_samples: FailedSamples,
    decode: Decode | None = None,
) -> dict:
    """Moves the gateway export into `out`, stamps rollout_status on samples, adds gateway stats to rows.
    With `decode` (the policy's tokenizer) the report gets a trajectory view of a few rollouts."""
    export = out / "gateway_export"
    records = pq.read_table(export / "records.parquet")
    samples = pq.read_table(export / "samples.parquet")
    status = {r["rollout_id"]: r["rollout_status"] for r in rows}
    unknown = set(records.column("rollout_id").to_pylist()) - set(status) if records.num_rows else set()
    if unknown:
        raise RuntimeError(
            f"gateway records for unknown rollouts {sorted(unknown)[:3]}: journal not from this run"
        )
    if samples.num_rows:
        ids = samples.column("rollout_id").to_pylist()
        samples = samples.set_column(
            samples.schema.get_field_index("rollout_status"),
            "rollout_status",
            pa.array([status[i] for i in ids], pa.string()),
        )
        if failed_samples is FailedSamples.DROP:
            keep = pa.array([status[i] == RolloutStatus.OK for i in ids])
            samples = samples.filter(keep)
    pq.write_table(records, out / "records.parquet")
    pq.write_table(samples, out / "samples.parquet")
    shutil.rmtree(export)
    columns = ["rollout_id", "chain_id", "op", "prompt_ids", "completion_ids", "discarded_trainable"]
    per_rollout = gateway_stats(records.select(columns).to_pylist() if records.num_rows else [])
    for r in rows:
        r["gateway"] = per_rollout.get(
            r["rollout_id"],
            {
                "calls": 0,
                "chains": 0,
                "splits": 0,
                "rollbacks": 0,
                "prompt_tokens_max": 0,
                "completion_tokens": 0,
                "discarded_trainable": 0,
            },
        )
    metrics = summarize(rows, gateway_metrics, wall_s, records.num_rows, samples.num_rows)
    png = plot_all(rows)
    atomic_write_bytes(out / "rollouts.png", png)
    view = ""
    if decode is not None:
        shown = [rid for rid, _ in pick_rollouts(rows, None)]
        view = trajectory_markdown(rows, read_calls(out / "records.parquet", shown), decode)
    atomic_write_text(out / "report.md", report_markdown(metrics, png, view))
    return metrics


def _per_turn(rows: list[dict], key: str) -> float:
    turns = sum(r["turns"] for r in rows)
    return sum(r[key] for r in rows) / turns if turns else 0.0


def samples_per_rollout(rows: list[dict]) -> dict[str, float]:
    """Of the rollouts that made a model call: the share that stayed a single sample (one chain), and the mean
    samples per rollout. A CLI agent's side calls (subagents, compaction, title generation) are chains of their
    own in the same rollout (one sample each, sharing its reward); Agent Lightning reports 36% and 2.4 for its
    coding agent."""
    counts = [r["gateway"]["chains"] for r in rows if r["gateway"]["chains"] > 0]
    if not counts:
        return {"single_sample_share": 0.0, "samples_per_rollout_mean": 0.0}
    return {
        "single_sample_share": sum(c == 1 for c in counts) / len(counts),
        "samples_per_rollout_mean": mean(counts),
    }


def summarize(rows: list[dict], gateway_metrics: dict, wall_s: float, n_records: int, n_samples: int) -> dict:
    by_harness: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_harness[r["spec_name"]].append(r)
    errors: Counter = Counter()
    for r in rows:
        errors.update(r["harness_errors"])

    def group(rs: list[dict]) -> dict[str, Any]:
        return {
            "rollouts": len(rs),
            "harness": rs[0]["harness"],
            "sandbox": rs[0]["sandbox"],
            "status": dict(Counter(r["rollout_status"] for r in rs)),
            "finish_reasons": dict(Counter(r["finish_reason"] for r in rs)),
            "turns_mean": mean(r["turns"] for r in rs),
            "calls": sum(r["gateway"]["calls"] for r in rs),
            "splits": sum(r["gateway"]["splits"] for r in rs),
            "rollbacks": sum(r["gateway"]["rollbacks"] for r in rs),
            **samples_per_rollout(rs),
            "completion_tokens": sum(r["gateway"]["completion_tokens"] for r in rs),
            "model_s_per_turn": _per_turn(rs, "model_s"),
            "tool_s_per_turn": _per_turn(rs, "tool_s"),
            "setup_s_mean": mean(r["setup_s"] for r in rs),
            "wall_s_mean": mean(r["wall_s"] for r in rs),
        }

    turns = sum(r["turns"] for r in rows)
    harness_overhead = sum(max(0.0, r["harness_wall_s"] - r["model_s"] - r["tool_s"]) for r in rows)
    return {
        "rollouts": len(rows),
        "tasks": len({r["group_id"] for r in rows}),
        "status": dict(Counter(r["rollout_status"] for r in rows)),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in rows)),
        "turns": turns,
        "turns_mean": turns / len(rows),
        "records": n_records,
        "samples": n_samples,
        "prompt_tokens_max": max((r["gateway"]["prompt_tokens_max"] for r in rows), default=0),
        "completion_tokens": sum(r["gateway"]["completion_tokens"] for r in rows),
        "splits": sum(r["gateway"]["splits"] for r in rows),
        "rollbacks": sum(r["gateway"]["rollbacks"] for r in rows),
        **samples_per_rollout(rows),
        "harness_errors": dict(errors),
        "wall_s": wall_s,
        "rollouts_per_hour": len(rows) / wall_s * 3600 if wall_s else 0.0,
        "model_s_per_turn": _per_turn(rows, "model_s"),
        "tool_s_per_turn": _per_turn(rows, "tool_s"),
        "harness_overhead_s_per_turn": harness_overhead / turns if turns else 0.0,
        "setup_s_mean": mean(r["setup_s"] for r in rows),
        "teardown_s_mean": mean(r["teardown_s"] for r in rows),
        "by_spec": {name: group(rs) for name, rs in sorted(by_harness.items())},
        "gateway": {
            k: gateway_metrics.get(k)
            for k in (
                "calls",
                "calls_failed",
                "op_new",
                "op_extend",
                "op_rollback",
                "op_fork",
                "drift_clean",
                "drift_realigned",
                "drift_forked",
                "context_exhausted",
            )
        },
    }


def plot_all(rows: list[dict]) -> bytes:
    """Turns per rollout, mean seconds per rollout by part, status:finish reason counts (one PNG)."""
    from harnessrl.reports import figure_png, new_figure

    specs = sorted({r["spec_name"] for r in rows})
    fig, grid = new_figure(3.4, 1, 3)
    axes = grid[0]
    ax = axes[0]
    for name in specs:
        ax.hist(
            [r["turns"] for r in rows if r["spec_name"] == name],
            alpha=0.6,
            label=name,
            bins=range(0, max(r["turns"] for r in rows) + 2),
        )
    ax.set_title("turns per rollout", fontsize=10)
    ax.set_xlabel("turns")
    ax.legend(fontsize=7)
    ax = axes[1]
    parts = ("model_s", "tool_s", "setup_s", "teardown_s")
    bottoms = [0.0] * len(specs)
    for part in parts:
        vals = [mean(r[part] for r in rows if r["spec_name"] == n) for n in specs]
        ax.bar(specs, vals, bottom=bottoms, label=part)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=False)]
    other = [
        mean(max(0.0, r["wall_s"] - sum(r[p] for p in parts)) for r in rows if r["spec_name"] == n)
        for n in specs
    ]
    ax.bar(specs, other, bottom=bottoms, label="other")
    ax.set_title("mean seconds per rollout", fontsize=10)
    ax.tick_params(axis="x", labelsize=7, rotation=15)
    ax.legend(fontsize=7)
    ax = axes[2]
    reasons = Counter(f"{r['rollout_status']}:{r['finish_reason']}" for r in rows)
    ax.barh(list(reasons), list(reasons.values()))
    ax.set_title("status:finish reason", fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    return figure_png(fig)


def report_markdown(m: dict, png: bytes, trajectories: str = "") -> str:
    from harnessrl.reports import code, counts_text, embed_png

    lines = [
        "# Rollout generation",
        "",
        f"{m['rollouts']} rollouts over {m['tasks']} tasks in {m['wall_s']:.1f} s "
        f"({m['rollouts_per_hour']:.0f} rollouts/hour); status {counts_text(m['status'])}.",
        "",
        f"{m['records']} gateway records, {m['samples']} samples; {m['splits']} splits, {m['rollbacks']} rollbacks; "
        f"{m['completion_tokens']} sampled tokens; longest prompt {m['prompt_tokens_max']} tokens.",
        "",
        f"Samples per rollout (one per chain: side calls, subagents and compaction are chains of their own): "
        f"mean {m['samples_per_rollout_mean']:.2f}, single-sample rollouts {m['single_sample_share']:.0%}.",
        "",
        f"Per turn: model {m['model_s_per_turn']:.3f} s, tools {m['tool_s_per_turn']:.3f} s, harness overhead "
        f"{m['harness_overhead_s_per_turn']:.4f} s. Setup (workspace + sandbox + session) {m['setup_s_mean']:.2f} s "
        f"per rollout.",
        "",
        embed_png(png, "turns, time per rollout, finish reasons"),
        "",
        # two tables of 6 columns: one of 11 is wider than the KFP UI's artifact panel
        "| spec | harness | sandbox | rollouts | status | mean turns |",
        "|---|---|---|---:|---|---:|",
    ]
    for name, g in m["by_spec"].items():
        lines.append(
            f"| {code(name)} | {code(g['harness'])} | {code(g['sandbox'])} | {g['rollouts']} | "
            f"{counts_text(g['status'])} | {g['turns_mean']:.1f} |"
        )
    lines += [
        "",
        "| spec | calls | splits | rollbacks | model s/turn | tool s/turn |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, g in m["by_spec"].items():
        lines.append(
            f"| {code(name)} | {g['calls']} | {g['splits']} | {g['rollbacks']} | "
            f"{g['model_s_per_turn']:.3f} | {g['tool_s_per_turn']:.3f} |"
        )
    lines += [
        "",
        f"Finish reasons: {counts_text(m['finish_reasons'])}. "
        f"Harness errors: {counts_text(m['harness_errors'] or {})}.",
        "",
        "Non-ok rollouts (failed / timeout / `infra_error`) keep their rows and reasons in `rollouts.jsonl`; "
        "their samples carry that `rollout_status` and are excluded from training statistics by the trainer's "
        "`--nonok` setting.",
    ]
    if trajectories:
        lines += ["", trajectories.rstrip("\n")]
    return "\n".join(lines) + "\n"
