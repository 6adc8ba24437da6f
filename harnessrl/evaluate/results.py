"""An evaluation's numbers: one policy's rollouts + verify rows -> its result; two results -> their difference.

    score_run(rollouts, rewards, policy, mode, k) -> dict     one policy in one mode (JSON-ready)
    compare(a, b, iterations, seed) -> dict                   b - a on their common tasks (paired bootstrap)
    load_evaluation(path) -> dict                             a saved evaluation.json, schema checked

Which rollouts count (as SWE-bench counts them): every rollout verify graded, whatever the harness's ending
(a timed-out agent's patch is graded like any other); rollouts with an infrastructure error (the rollout's or
verify's) are left out of every rate and listed under `excluded`, never counted as failures.

pass@1 is resolved / graded over all graded rollouts, with the Wilson 95% interval; pass@k (k >= 2) is the
unbiased estimator averaged over the tasks with at least k graded rollouts. A comparison pairs tasks: each
task's score is its resolved fraction, and the difference of the means is bootstrapped over tasks.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

from harnessrl.evaluate.stats import paired_bootstrap, pass_at_k, wilson_interval
from harnessrl.schema import RolloutStatus
from harnessrl.verify.grading import GRADED, VerifyStatus

SCHEMA = "harnessrl.evaluation/1"  # bump when a field a comparison reads changes meaning
MAX_ERRORS = 10


class EvalMode(StrEnum):
    """How rollouts sample: greedy (temperature 0, one rollout per task) or sampled (the spec's temperature,
    k rollouts per task)."""

    GREEDY = "greedy"
    SAMPLED = "sampled"


def pass_k_values(k: int) -> list[int]:
    """The k of pass@k reported for k rollouts per task: 1, 2, 4, ... and k itself."""
    values = [1]
    while values[-1] * 2 < k:
        values.append(values[-1] * 2)
    return sorted({*values, k}) if k >= 1 else []


def _error_key(text: str) -> str:
    return " ".join(str(text).split())[:160]


def score_run(
    rollouts: Iterable[dict], rewards: Iterable[dict], policy: str, mode: EvalMode, k: int
) -> dict[str, Any]:
    """One policy in one mode from generate's rollout rows and verify's reward rows (joined on rollout_id)."""
    verdicts = {r["rollout_id"]: r for r in rewards}
    tasks: dict[str, dict[str, Any]] = {}
    finish: Counter[str] = Counter()
    rollout_status: Counter[str] = Counter()
    verify_status: Counter[str] = Counter()
    excluded: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    n_rollouts = 0
    for r in rollouts:
        n_rollouts += 1
        t = tasks.setdefault(
            r["instance_id"], {"repo": r.get("repo", ""), "n": 0, "graded": 0, "resolved": 0}
        )
        t["n"] += 1
        finish[str(r.get("finish_reason") or "none")] += 1
        status = str(r.get("rollout_status") or RolloutStatus.OK)
        rollout_status[status] += 1
        if r.get("error"):
            errors[_error_key(r["error"])] += 1
        v = verdicts.get(r["rollout_id"])
        vstatus = str(v.get("verify_status", "")) if v is not None else "not_verified"
        verify_status[vstatus] += 1
        if status == RolloutStatus.INFRA_ERROR:
            excluded[f"rollout_{status}"] += 1
        elif v is None or vstatus not in GRADED:
            excluded[f"verify_{vstatus}"] += 1
            if v is not None and v.get("detail"):
                errors[_error_key(f"verify: {v['detail']}")] += 1
        else:
            t["graded"] += 1
            t["resolved"] += int(vstatus == VerifyStatus.RESOLVED)
    graded = sum(t["graded"] for t in tasks.values())
    resolved = sum(t["resolved"] for t in tasks.values())
    low, high = wilson_interval(resolved, graded)
    pass_k: dict[str, dict[str, float | int | None]] = {}
    for kk in pass_k_values(k):
        usable = [t for t in tasks.values() if t["graded"] >= kk]
        value = (
            sum(pass_at_k(t["graded"], t["resolved"], kk) for t in usable) / len(usable) if usable else None
        )
        pass_k[str(kk)] = {"value": value, "tasks": len(usable)}
    per_repo: dict[str, Counter[str]] = defaultdict(Counter)
    for t in tasks.values():
        c = per_repo[t["repo"]]
        c["tasks"] += 1
        c["graded"] += t["graded"]
        c["resolved"] += t["resolved"]
        c["tasks_resolved"] += int(t["resolved"] > 0)
    return {
        "policy": policy,
        "mode": str(mode),
        "k": k,
        "tasks": len(tasks),
        "tasks_scored": sum(1 for t in tasks.values() if t["graded"]),
        "rollouts": n_rollouts,
        "graded": graded,
        "resolved": resolved,
        "pass_at_1": resolved / graded if graded else None,
        "pass_at_1_ci": [low, high],
        "pass_at_k": pass_k,
        "per_repo": {
            repo: {**c, "pass_at_1": c["resolved"] / c["graded"] if c["graded"] else None}
            for repo, c in sorted(per_repo.items())
        },
        "finish_reasons": dict(finish.most_common()),
        "rollout_status": dict(rollout_status.most_common()),
        "verify_status": dict(verify_status.most_common()),
        "excluded": dict(excluded.most_common()),
        "errors": dict(errors.most_common(MAX_ERRORS)),
        "resolved_tasks": sorted(i for i, t in tasks.items() if t["resolved"] > 0),
        "per_task": {i: tasks[i] for i in sorted(tasks)},
    }


def task_scores(result: dict[str, Any]) -> dict[str, float]:
    """Each scored task's resolved fraction (its pass@1)."""
    return {i: t["resolved"] / t["graded"] for i, t in result["per_task"].items() if t["graded"]}


def compare(
    a: dict[str, Any], b: dict[str, Any], *, iterations: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """b - a in pass@1 over the tasks both scored, with the paired bootstrap's interval and verdict."""
    sa, sb = task_scores(a), task_scores(b)
    common = sorted(set(sa) & set(sb))
    if not common:
        raise ValueError(
            f"{a['policy']} and {b['policy']} ({a['mode']}) have no scored task in common; evaluate both on "
            "the same task set"
        )
    boot = paired_bootstrap(
        [sa[i] for i in common], [sb[i] for i in common], iterations=iterations, seed=seed
    )
    return {
        "a": a["policy"],
        "b": b["policy"],
        "mode": a["mode"],
        "metric": "pass_at_1",
        "tasks_only_a": len(set(sa) - set(sb)),
        "tasks_only_b": len(set(sb) - set(sa)),
        "a_pass_at_1": sum(sa[i] for i in common) / len(common),
        "b_pass_at_1": sum(sb[i] for i in common) / len(common),
        **boot.to_dict(),
        "a_only_resolved": sorted(i for i in common if sa[i] > 0 and sb[i] == 0),
        "b_only_resolved": sorted(i for i in common if sb[i] > 0 and sa[i] == 0),
    }


def describe(c: dict[str, Any]) -> str:
    """One line: the difference, its interval, and the verdict."""
    verdict = "significant" if c["significant"] else "not significant"
    p = f"p={c['p_value']:.3g}" if c["p_value"] > 0 else f"p<{1 / c['iterations']:.1g}"  # none flipped sign
    return (
        f"{c['b']} - {c['a']} ({c['mode']} pass@1, {c['tasks']} paired tasks): {c['diff']:+.3f} "
        f"[{int(round(c['confidence'] * 100))}% CI {c['low']:+.3f}, {c['high']:+.3f}], {p}: "
        f"{verdict} ({c['a']} {c['a_pass_at_1']:.3f}, {c['b']} {c['b_pass_at_1']:.3f})"
    )


def load_evaluation(path: str | Path) -> dict[str, Any]:
    """A saved evaluation.json (or a directory holding one), its schema checked."""
    path = Path(path)
    if path.is_dir():
        path = path / "evaluation.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such evaluation file (written by `harnessrl stage evaluate`)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"{path}: field 'schema' is {schema!r}, expected {SCHEMA!r}; re-run the evaluation")
    for i, r in enumerate(data.get("results") or []):
        missing = [f for f in ("policy", "mode", "per_task") if f not in r]
        if missing:
            raise ValueError(f"{path}: results[{i}] lacks {missing}; re-run the evaluation")
    if not data.get("results"):
        raise ValueError(f"{path}: 'results' is empty; nothing to compare")
    return data


def pick_result(data: dict[str, Any], where: str, policy: str | None, mode: str | None) -> dict[str, Any]:
    """The result of `policy` (default: the file's last policy) in `mode` (default: sampled if present)."""
    results = data["results"]
    policies = list(dict.fromkeys(r["policy"] for r in results))
    name = policy or policies[-1]
    mine = [r for r in results if r["policy"] == name]
    if not mine:
        raise ValueError(f"{where}: no policy {name!r}; it holds {policies}")
    modes = [r["mode"] for r in mine]
    wanted = mode or (EvalMode.SAMPLED if EvalMode.SAMPLED in modes else modes[0])
    for r in mine:
        if r["mode"] == wanted:
            return r
    raise ValueError(f"{where}: policy {name!r} was not evaluated in mode {wanted!r} (modes: {modes})")
