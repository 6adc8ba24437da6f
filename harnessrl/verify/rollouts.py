"""The verify stage: grade every rollout of a generate run, in parallel.

    run_verify(tasks: Path, rollouts: Path, out: Path, workers: int = 2, ...) -> dict (the summary)

`rollouts` is a JSONL file (or a directory holding `rollouts.jsonl`) with one row per rollout:
`{rollout_id, instance_id, workspace}` (a directory; relative paths are resolved against the file's folder),
or `{..., model_patch}` (a diff the framework computed against the task tip, as the generate stage writes it),
or `{..., patch}` (any patch, applied to a fresh tip first). A row whose `rollout_status` is `infra_error` is not
graded (its reward stays null). Each row's reward is the one its harness spec names (`reward_fn`, as generate
records it, else `spec.reward`; default swebench): two rollouts with the same verdict may get different rewards.

Output directory (replaced atomically, so reruns are idempotent):
    rewards.jsonl   one row per rollout: rollout_id, instance_id, reward (1/0/null), status (what the trainer
                    keys on: "ok" when graded and the rollout was ok, the rollout's own status when it was
                    failed/timeout, "infra_error" when not graded), rollout_status, verify_status (resolved | unresolved |
                    timeout | resource_limit | apply_failed | infra_error), resolved, f2p_fraction, flagged,
                    dropped, suspicious, tests, diff, detail, timings
    logs/<rollout_id>.log   the full pytest log (file name: sandbox.workspace.safe_name of the id)
    summary.json, report.md (with status_counts.png)
"""

from __future__ import annotations

import json
import time
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from harnessrl.environments.base import Finished, Grading, Reward, RewardStatus
from harnessrl.environments.registry import call_reward, environment_name, environment_of, resolve_reward
from harnessrl.io import atomic_output, read_jsonl, write_jsonl
from harnessrl.progress import ProgressBar
from harnessrl.rollout.specs import parse_reward
from harnessrl.sandbox.backends import DEFAULT_CHOICE, SandboxChoice
from harnessrl.sandbox.base import Limits
from harnessrl.sandbox.workspace import safe_name
from harnessrl.schema import SCORED_STATUSES, HarnessSpec, RewardName, RolloutStatus, SandboxKind
from harnessrl.taskset import TaskSet
from harnessrl.verify.grading import GRADED, VerifyStatus
from harnessrl.verify.verifier import (
    DEFAULT_TIMEOUT_S,
    VerifyResult,
    apply_reward,
    verify_diff,
    verify_patch,
    verify_workspace,
)


def load_rollouts(rollouts: Path) -> tuple[list[dict], Path]:
    rollouts = Path(rollouts)
    path = rollouts / "rollouts.jsonl" if rollouts.is_dir() else rollouts
    if not path.is_file():
        raise FileNotFoundError(
            f"{rollouts}: no rollouts file (expected a JSONL file or a directory with "
            "rollouts.jsonl, as `harnessrl stage generate` writes it)"
        )
    rows = list(read_jsonl(path))
    seen: set[str] = set()
    for i, row in enumerate(rows, 1):
        for key in ("rollout_id", "instance_id"):
            if not row.get(key):
                raise ValueError(f"{path}: row {i}: missing {key!r}")
        if row["rollout_id"] in seen:
            raise ValueError(f"{path}: row {i}: duplicate rollout_id {row['rollout_id']!r}")
        seen.add(row["rollout_id"])
        parse_reward(rollout_reward(row), f"{path}: row {i} ({row['rollout_id']}): reward_fn")
        if row.get("rollout_status") != "infra_error" and not any(
            k in row for k in ("workspace", "model_patch", "patch", "final_answer")
        ):
            raise ValueError(
                f"{path}: row {i} ({row['rollout_id']}): needs one of 'workspace', 'model_patch', 'patch' "
                "(a swe task's work) or 'final_answer' (an answer-graded environment's)"
            )
    return rows, path.parent


def rollout_reward(rollout: dict) -> str:
    """The reward the rollout's harness spec names: `reward_fn` (generate's column), else `spec.reward`
    ("": the environment's default)."""
    spec = rollout.get("spec")
    return str(rollout.get("reward_fn") or (spec.get("reward") if isinstance(spec, dict) else None) or "")


def spec_sandbox(spec: HarnessSpec) -> SandboxChoice:
    """Where a rollout run under `spec` is verified when the caller follows the spec (the RL loop does; the
    verify stage takes its `--sandbox`): the spec's backend and network, so a podman or Kubernetes rollout is
    graded in a fresh container or pod of its task's image, as it ran. A `local` spec (unsandboxed, for
    debugging) is verified in bubblewrap: verification always runs in a sandbox."""
    if spec.sandbox is SandboxKind.LOCAL:
        return DEFAULT_CHOICE
    return SandboxChoice(spec.sandbox, spec.network)


def rollout_sandbox(rollout: dict) -> SandboxChoice:
    """Where one rollout row is verified when its caller follows the specs (`run_verify(sandbox=None)`): its
    spec's `sandbox` and `network` (spec_sandbox); a row without a spec, in bubblewrap."""
    spec = rollout.get("spec")
    if not isinstance(spec, dict) or not spec.get("sandbox"):
        return DEFAULT_CHOICE
    return spec_sandbox(HarnessSpec(sandbox=SandboxKind(spec["sandbox"]), network=spec.get("network")))


def verify_rollout(
    taskset: TaskSet,
    tasks: dict[str, dict],
    rollout: dict,
    base: Path,
    timeout_s: float,
    limits: Limits | None,
    sandbox: SandboxChoice = DEFAULT_CHOICE,
) -> VerifyResult:
    """The verdict on one rollout, with the reward its spec names. A swe task's is the tests' verdict
    (below); any other environment's comes from its `reward` (environments.base), run here, outside the
    agent's sandbox."""
    row = tasks.get(rollout["instance_id"])
    if row is not None and environment_name(row) != "swe":
        return _environment_verdict(row, rollout, Grading(taskset, timeout_s, limits, sandbox))
    result = _verdict(taskset, tasks, rollout, base, timeout_s, limits, sandbox)
    return apply_reward(result, RewardName(rollout_reward(rollout) or RewardName.SWEBENCH))


def _environment_verdict(row: dict, rollout: dict, grading: Grading) -> VerifyResult:
    iid = row["instance_id"]
    if rollout.get("rollout_status") == RolloutStatus.INFRA_ERROR:  # graded otherwise, as a swe rollout is:
        # the rewards row keeps a failed or timed-out rollout's own status, and the trainer decides
        return VerifyResult(
            iid, VerifyStatus.INFRA_ERROR, detail="the rollout itself failed (infra_error); not graded"
        )
    finished = Finished(
        str(rollout.get("final_answer") or ""),
        str(rollout.get("model_patch") or ""),
        rollout,
        tuple(str(s) for s in rollout.get("snapshots") or ()),
    )
    try:
        env = environment_of(row)
        name = resolve_reward(env, rollout_reward(rollout), row)
        reward = call_reward(name, row, finished) if ":" in name else env.reward(row, finished, name, grading)
    except Exception as e:  # ours (or the environment's), never the agent's: keep the row with why
        reward = Reward.failed(f"task {iid}: {type(e).__name__}: {e}")
        name = rollout_reward(rollout)
    if reward.status is RewardStatus.INFRA_ERROR or reward.total is None:
        return VerifyResult(iid, VerifyStatus.INFRA_ERROR, detail=reward.detail, reward_fn=name)
    resolved = reward.total >= 1.0
    return VerifyResult(
        iid,
        VerifyStatus.RESOLVED if resolved else VerifyStatus.UNRESOLVED,
        resolved=resolved,
        reward=reward.total,
        reward_parts=dict(reward.parts),
        detail=reward.detail,
        reward_fn=name,
    )


def _verdict(
    taskset: TaskSet,
    tasks: dict[str, dict],
    rollout: dict,
    base: Path,
    timeout_s: float,
    limits: Limits | None,
    sandbox: SandboxChoice = DEFAULT_CHOICE,
) -> VerifyResult:
    iid = rollout["instance_id"]
    if iid not in tasks:
        return VerifyResult(
            iid, VerifyStatus.INFRA_ERROR, detail=f"instance {iid!r} is not in the task set {taskset.root}"
        )
    row = tasks[iid]
    if rollout.get("rollout_status") == "infra_error":
        return VerifyResult(
            iid, VerifyStatus.INFRA_ERROR, detail="the rollout itself failed (infra_error); not graded"
        )
    if rollout.get("rollout_status") == RolloutStatus.PATCH_TOO_LARGE:
        return VerifyResult(
            iid,
            VerifyStatus.UNRESOLVED,
            reward=0.0,
            detail="the agent's diff was over the patch cap (no patch kept): scored 0 without running tests",
        )
    try:
        if rollout.get("workspace"):
            ws = Path(rollout["workspace"])
            return verify_workspace(
                taskset,
                row,
                ws if ws.is_absolute() else base / ws,
                timeout_s=timeout_s,
                limits=limits,
                sandbox=sandbox,
            )
        if "model_patch" in rollout:
            patch = rollout["model_patch"] or ""
            return verify_diff(taskset, row, patch, timeout_s=timeout_s, limits=limits, sandbox=sandbox)
        patch = rollout.get("patch") or ""
        return verify_patch(taskset, row, patch, timeout_s=timeout_s, limits=limits, sandbox=sandbox)
    except Exception as e:  # any crash here is ours, never the agent's: keep the row with why
        return VerifyResult(
            iid,
            VerifyStatus.INFRA_ERROR,
            detail=f"{type(e).__name__}: {e}",
            test_log=traceback.format_exc()[-5000:],
        )


def reward_row(rollout: dict, r: VerifyResult) -> dict[str, Any]:
    d = r.to_dict()
    log = d.pop("test_log")
    graded = r.status in GRADED
    rollout_status = rollout.get("rollout_status") or "ok"
    # A rollout the generate stage marked failed/timeout keeps that status (the trainer decides what to do
    # with it); only a graded rollout the agent is accountable for (SCORED_STATUSES) becomes "ok".
    status = ("ok" if rollout_status in SCORED_STATUSES else rollout_status) if graded else "infra_error"
    return {
        "rollout_id": rollout["rollout_id"],
        "instance_id": r.instance_id,
        "reward": r.reward if graded else None,
        "status": status,
        "rollout_status": rollout_status,
        "verify_status": r.status,
        **{k: v for k, v in d.items() if k not in ("instance_id", "status", "reward")},
        "log_tail": log[-2000:],
    }


def run_verify(
    tasks: Path,
    rollouts: Path,
    out: Path,
    workers: int = 2,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limits: Limits | None = None,
    sandbox: SandboxChoice | None = DEFAULT_CHOICE,
) -> dict[str, Any]:
    """`sandbox`: the backend every test run uses (podman / kubernetes: the task's image_name); None: each
    rollout's own spec says (`rollout_sandbox`), as the RL loop, the difficulty estimate and the evaluation do."""
    taskset = TaskSet.open(tasks)
    by_id = {r["instance_id"]: r for r in taskset.rows()}
    rows, base = load_rollouts(rollouts)
    workers = max(1, int(workers))
    started = time.monotonic()
    results: dict[str, tuple[dict, VerifyResult]] = {}
    with ProgressBar("verify", total=len(rows)) as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(
                verify_rollout, taskset, by_id, r, base, timeout_s, limits, sandbox or rollout_sandbox(r)
            ): r
            for r in rows
        }
        for fut in as_completed(futures):
            rollout = futures[fut]
            results[rollout["rollout_id"]] = (rollout, fut.result())
            resolved = sum(1 for _, v in results.values() if v.resolved)
            bar.advance(description=f"verify: {resolved} resolved")
    wall = time.monotonic() - started
    ordered = [results[r["rollout_id"]] for r in rows]
    statuses = Counter(v.status for _, v in ordered)
    graded = [v for _, v in ordered if v.status in GRADED]
    summary = {
        "rollouts": len(rows),
        "graded": len(graded),
        "resolved": sum(v.resolved for v in graded),
        "infra_errors": statuses.get(VerifyStatus.INFRA_ERROR, 0),
        "flagged": sum(v.flagged for _, v in ordered),
        "reward_mean": (sum(v.reward or 0.0 for v in graded) / len(graded)) if graded else None,
        "status_counts": dict(sorted(statuses.items())),
        "workers": workers,
        "sandbox": str(sandbox.kind) if sandbox else "per spec",
        "wall_s": round(wall, 3),
        "verifications_per_min": round(60 * len(rows) / wall, 2) if wall > 0 else None,
        "environments": by_environment(ordered, by_id),
    }
    with atomic_output(Path(out)) as tmp:
        tmp.mkdir(parents=True)
        write_jsonl(tmp / "rewards.jsonl", (reward_row(r, v) for r, v in ordered))
        (tmp / "logs").mkdir()
        for r, v in ordered:
            (tmp / "logs" / f"{safe_name(r['rollout_id'])}.log").write_text(v.test_log)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        (tmp / "report.md").write_text(render_report(summary, ordered, tmp))
    return summary


def by_environment(ordered: list[tuple[dict, VerifyResult]], tasks: dict[str, dict]) -> dict[str, dict]:
    """Per environment of the rollouts' tasks: counts, the rewards named, the mean reward and of each part."""
    groups: dict[str, list[VerifyResult]] = defaultdict(list)
    for rollout, result in ordered:
        groups[environment_name(tasks.get(rollout["instance_id"]) or {})].append(result)
    out: dict[str, dict] = {}
    for env, results in sorted(groups.items()):
        graded = [v for v in results if v.status in GRADED]
        parts: dict[str, list[float]] = defaultdict(list)
        for v in graded:
            for name, value in v.reward_parts.items():
                parts[name].append(value)
        out[env] = {
            "rollouts": len(results),
            "graded": len(graded),
            "resolved": sum(v.resolved for v in graded),
            "infra_errors": sum(v.status is VerifyStatus.INFRA_ERROR for v in results),
            "rewards": sorted({str(v.reward_fn) for v in results}),
            "reward_mean": sum(v.reward or 0.0 for v in graded) / len(graded) if graded else None,
            "part_means": {name: sum(xs) / len(xs) for name, xs in sorted(parts.items())},
        }
    return out


def environment_table(environments: dict[str, dict]) -> list[str]:
    """The report's section per environment (what each reward measures: docs/environments.md)."""
    from harnessrl.reports import code

    lines = ["## By environment", ""]
    lines += [
        "| environment | reward | rollouts | graded | resolved | infra errors | reward mean | parts (mean) |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for env, e in environments.items():
        mean = "n/a" if e["reward_mean"] is None else f"{e['reward_mean']:.3f}"
        shown = list(e["part_means"].items())[:6]
        parts = ", ".join(f"{code(k)} {v:.2f}" for k, v in shown) + (" …" if len(e["part_means"]) > 6 else "")
        cells = [code(env), ", ".join(code(r) for r in e["rewards"]), str(e["rollouts"]), str(e["graded"])]
        cells += [str(e["resolved"]), str(e["infra_errors"]), mean, parts or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def render_report(summary: dict, ordered: list[tuple[dict, VerifyResult]], out: Path) -> str:
    from harnessrl.reports import bar_chart_png, code, embed_png

    png = bar_chart_png(summary["status_counts"], "verify: rollouts by status", "rollouts")
    (out / "status_counts.png").write_bytes(png)
    lines = [
        "# Verify",
        "",
        f"{summary['rollouts']} rollouts, {summary['graded']} graded, {summary['resolved']} resolved, "
        f"{summary['infra_errors']} infra errors, {summary['flagged']} flagged "
        f"({summary['wall_s']} s, {summary['workers']} workers).",
        "",
        embed_png(png, "rollouts by status"),
        "",
        *environment_table(summary["environments"]),
    ]
    # generate names rollouts <instance>__r<k>: then a separate instance column only widens the table
    by_instance = all(str(r["rollout_id"]).startswith(v.instance_id) for r, v in ordered)
    header = ["rollout", *([] if by_instance else ["instance"]), "status", "reward", "detail"]
    if by_instance:
        lines += ["Rollout ids are `<instance>__r<k>`.", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r, v in ordered[:200]:
        dropped = ", ".join(sorted({d["path"] for d in v.dropped}))[:80]
        detail = v.detail[:100].replace("|", "/").replace("`", "'")
        if dropped:  # a column of its own would make the table wider than the KFP UI's panel
            detail = f"dropped {code(dropped)}" + (f"; {detail}" if detail else "")
        cells = [str(r["rollout_id"]), *([] if by_instance else [code(v.instance_id)]), code(v.status)]
        cells += [str(v.reward), detail]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
