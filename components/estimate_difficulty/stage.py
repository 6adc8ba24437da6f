"""`estimate_difficulty`: Best-of-N (default N=4) generate + verify per task, then pass counts per task.

Output directory:
    pass_counts.jsonl   one row per task: instance_id, repo, n, n_valid, passes, pass_rate, excluded {reason: k}
    history.jsonl       the pass-rate history store with this estimate as round 0 (or --round)
    rollouts/           the generate stage's output (records, samples, report)
    verified/           the verify stage's output (rewards.jsonl, logs)
    pass_rate_hist.png, report.md, metrics.json

Only graded rollouts the agent is accountable for (rollout_status ok or patch_too_large) count towards
n_valid; the others are listed under `excluded` with their reason, never counted as failures.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.difficulty.history import PassRateHistory
from harnessrl.difficulty.selection import DifficultyClass, classify, plot_pass_rate_histogram
from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, read_jsonl, write_jsonl
from harnessrl.rollout.config import DEFAULT_CONCURRENCY
from harnessrl.rollout.executors import ExecutorName
from harnessrl.schema import SCORED_STATUSES, RolloutStatus

if TYPE_CHECKING:
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.rollout.specs import NamedSpec


def count_passes(rollouts: list[dict], rewards: list[dict]) -> list[dict]:
    """Joins rollout rows with verify's reward rows into one pass-count row per task."""
    by_rollout = {r["rollout_id"]: r for r in rewards}
    tasks: dict[str, dict[str, Any]] = {}
    for r in rollouts:
        t = tasks.setdefault(
            r["instance_id"],
            {
                "instance_id": r["instance_id"],
                "repo": r["repo"],
                "n": 0,
                "n_valid": 0,
                "passes": 0,
                "excluded": Counter(),
            },
        )
        t["n"] += 1
        verdict = by_rollout.get(r["rollout_id"])
        if r.get("rollout_status", RolloutStatus.OK) not in SCORED_STATUSES:
            t["excluded"][f"rollout_{r['rollout_status']}"] += 1
        elif verdict is None:
            t["excluded"]["not_verified"] += 1
        elif verdict.get("status") != "ok" or verdict.get("reward") is None:
            t["excluded"][f"verify_{verdict.get('verify_status', verdict.get('status'))}"] += 1
        else:
            t["n_valid"] += 1
            t["passes"] += int(bool(verdict.get("resolved", float(verdict["reward"]) >= 1.0)))
    out = []
    for t in sorted(tasks.values(), key=lambda x: x["instance_id"]):
        t["excluded"] = dict(t["excluded"])
        t["pass_rate"] = t["passes"] / t["n_valid"] if t["n_valid"] else None
        out.append(t)
    return out


def run_estimate(
    tasks: str | Path,
    out: str | Path,
    n: int = 4,
    specs: list[NamedSpec] | str | Path | None = None,
    model: ModelSource | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    verify_workers: int = 2,
    max_tasks: int | None = None,
    history_round: int = 0,
    allow_unsandboxed: bool = False,
    executor: ExecutorName = ExecutorName.THREADS,
    ray_cpus: float = 0.5,
) -> dict[str, Any]:
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.verify.rollouts import run_verify

    if n < 1:
        raise ValueError(f"n (rollouts per task) must be >= 1, got {n}")
    out = Path(out)
    with atomic_output(out) as tmp:
        gen_metrics = run_generate(
            tasks,
            tmp / "rollouts",
            specs,
            model,
            GenerateConfig(
                group_size=n,
                concurrency=concurrency,
                max_tasks=max_tasks,
                allow_unsandboxed=allow_unsandboxed,
                executor=executor,
                ray_cpus=ray_cpus,
            ),
        )
        verify_summary = run_verify(
            Path(tasks), tmp / "rollouts", tmp / "verified", verify_workers, sandbox=None
        )
        rollouts = list(read_jsonl(tmp / "rollouts" / "rollouts.jsonl"))
        rewards = list(read_jsonl(tmp / "verified" / "rewards.jsonl"))
        counts = count_passes(rollouts, rewards)
        write_jsonl(tmp / "pass_counts.jsonl", counts)
        PassRateHistory(tmp / "history.jsonl").record_round(
            history_round, {c["instance_id"]: (c["n_valid"], c["passes"]) for c in counts}
        )
        plot_pass_rate_histogram(counts, tmp / "pass_rate_hist.png", title=f"Best-of-{n} pass rate per task")
        classes = Counter(classify(c["n_valid"], c["passes"]) for c in counts)
        excluded: Counter = Counter()
        for c in counts:
            excluded.update(c["excluded"])
        metrics = {
            "tasks": len(counts),
            "n": n,
            "rollouts": len(rollouts),
            "valid_rollouts": sum(c["n_valid"] for c in counts),
            "passes": sum(c["passes"] for c in counts),
            **{c.value: classes[c] for c in DifficultyClass},
            "excluded": dict(excluded),
            "generate_wall_s": gen_metrics["wall_s"],
            "verify_wall_s": verify_summary.get("wall_s"),
            "rollouts_per_hour": gen_metrics["rollouts_per_hour"],
        }
        atomic_write_json(tmp / "metrics.json", metrics)
        atomic_write_text(
            tmp / "report.md", _report(metrics, counts, (tmp / "pass_rate_hist.png").read_bytes())
        )
    return metrics


def _report(m: dict, counts: list[dict], png: bytes) -> str:
    from harnessrl.reports import code, counts_text, embed_png

    per_repo: dict[str, Counter] = defaultdict(Counter)
    for c in counts:
        per_repo[c["repo"]][classify(c["n_valid"], c["passes"])] += 1
    lines = [
        "# Difficulty estimation (Best-of-N)",
        "",
        f"{m['tasks']} tasks × N={m['n']}: {m['rollouts']} rollouts, {m['valid_rollouts']} finished and graded, "
        f"{m['passes']} passed. Tasks: {m[DifficultyClass.MIXED]} mixed, {m[DifficultyClass.ALL_PASS]} all-pass, "
        f"{m[DifficultyClass.ALL_FAIL]} all-fail, {m[DifficultyClass.NO_VALID_ROLLOUTS]} without a valid rollout.",
        "",
        f"Excluded rollouts (not counted as failures): {counts_text(m['excluded'])}.",
        "",
        embed_png(png, "pass-rate histogram"),
        "",
        "| repo | mixed | all-pass | all-fail | no valid rollout |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {code(repo)} | {c[DifficultyClass.MIXED]} | {c[DifficultyClass.ALL_PASS]} | {c[DifficultyClass.ALL_FAIL]} "
        f"| {c[DifficultyClass.NO_VALID_ROLLOUTS]} |"
        for repo, c in sorted(per_repo.items())
    ]
    return "\n".join(lines) + "\n"
