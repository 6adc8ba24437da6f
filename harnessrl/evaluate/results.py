"""An evaluation's numbers: one policy's rollouts + verify rows -> its result; two results -> their difference.

    score_run(rollouts, rewards, policy, mode, k, calls) -> dict   one policy in one mode (JSON-ready)
    compare(a, b, iterations, seed) -> dict                   b - a on their common tasks (paired bootstrap)
    comparisons(results, ...) -> list                         every policy against the first, per mode
    eval_groups(task_rows) / group_figures(results, groups)   the same figures per held-out group
    first_replies(rollouts, rewards) / side_by_side(...)      one request answered by each policy, as kept
    load_evaluation(path) -> dict                             a saved evaluation.json, schema checked

Which rollouts count (as SWE-bench counts them): every rollout verify graded, whatever the harness's ending
(a timed-out agent's patch is graded like any other); rollouts with an infrastructure error (the rollout's or
verify's) are left out of every rate and listed under `excluded`, never counted as failures.

pass@1 is resolved / graded over all graded rollouts, with the Wilson 95% interval; pass@k (k >= 2) is the
unbiased estimator averaged over the tasks with at least k graded rollouts. A comparison pairs tasks: each
task's score is its resolved fraction, and the difference of the means is bootstrapped over tasks. A result
also says what the policy's replies looked like (gateway/replies.py: tokens per model call, the share cut by
the reply budget, distinct-2), from the gateway records of its model calls.

Held-out groups: a task row may name its group (`eval_group`, e.g. held-out requests of the kinds trained on
vs kinds never trained). When the evaluated tasks form more than one group (a task without the field is then
in "other"), each group gets the whole set's statistics on its own tasks: each policy's pass@1 with its Wilson
interval and each policy minus the first with the paired bootstrap.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from harnessrl.evaluate.stats import paired_bootstrap, pass_at_k, wilson_interval
from harnessrl.gateway.replies import reply_counts
from harnessrl.rollout.trajectories import clip
from harnessrl.schema import RolloutStatus
from harnessrl.verify.grading import GRADED, VerifyStatus

logger = logging.getLogger(__name__)

SCHEMA = "harnessrl.evaluation/1"  # bump when a field a comparison reads changes meaning
MAX_ERRORS = 10
OTHER_GROUP = "other"  # the held-out group of a task without `eval_group`, when other tasks name theirs
EXAMPLE_CHARS = 1200  # the side-by-side request and each reply, as evaluation.json keeps them


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
    rollouts: Iterable[dict],
    rewards: Iterable[dict],
    policy: str,
    mode: EvalMode,
    k: int,
    calls: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One policy in one mode from generate's rollout rows and verify's reward rows (joined on rollout_id);
    `calls`: the gateway records of its model calls (records.parquet rows: `completion_ids`,
    `finish_reason`), for the reply figures."""
    verdicts = {r["rollout_id"]: r for r in rewards}
    tasks: dict[str, dict[str, Any]] = {}
    finish: Counter[str] = Counter()
    rollout_status: Counter[str] = Counter()
    verify_status: Counter[str] = Counter()
    excluded: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    part_sums: defaultdict[str, float] = defaultdict(float)
    part_counts: Counter[str] = Counter()
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
            for name, value in (v.get("reward_parts") or {}).items():
                part = name.split("#")[0]  # an instruction task's "placeholders#0": the constraint's kind
                part_sums[part] += float(value)
                part_counts[part] += 1
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
        # each reward part's mean over the graded rollouts that have it: which constraints a policy meets
        "reward_parts": {p: part_sums[p] / part_counts[p] for p in sorted(part_counts)},
        **reply_counts((c["completion_ids"], c["finish_reason"]) for c in calls).figures().row(),
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


def comparisons(results: list[dict[str, Any]], *, iterations: int, seed: int) -> list[dict[str, Any]]:
    """Every policy against the first one (the baseline), in each mode; a pair with no scored task in common
    (infrastructure errors) is left out with a warning: the results still stand."""
    out = []
    base_name = results[0]["policy"] if results else None
    for base in (r for r in results if r["policy"] == base_name):
        for r in results:
            if r["mode"] != base["mode"] or r["policy"] == base_name:
                continue
            try:
                out.append(compare(base, r, iterations=iterations, seed=seed))
            except ValueError as e:
                logger.warning("evaluate: no comparison: %s", e)
    return out


def eval_groups(task_rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Instance id -> its held-out group (`eval_group`; "other" for a task without one) when the tasks form
    more than one group; {} when they form one (or none names its group)."""
    named = {str(r["instance_id"]): r.get("eval_group") for r in task_rows}
    if not any(named.values()):
        return {}
    groups = {i: str(g) if g else OTHER_GROUP for i, g in named.items()}
    return groups if len(set(groups.values())) > 1 else {}


def restrict(result: dict[str, Any], task_ids: set[str]) -> dict[str, Any]:
    """`result` on these tasks only: pass@1 and its Wilson interval over their graded rollouts, and their
    `per_task` rows (what `compare` pairs on)."""
    per_task = {i: t for i, t in result["per_task"].items() if i in task_ids}
    graded = sum(t["graded"] for t in per_task.values())
    resolved = sum(t["resolved"] for t in per_task.values())
    return {
        "policy": result["policy"],
        "mode": result["mode"],
        "tasks": len(per_task),
        "tasks_scored": sum(1 for t in per_task.values() if t["graded"]),
        "graded": graded,
        "resolved": resolved,
        "pass_at_1": resolved / graded if graded else None,
        "pass_at_1_ci": list(wilson_interval(resolved, graded)),
        "per_task": per_task,
    }


def group_figures(
    results: list[dict[str, Any]], groups: Mapping[str, str], *, iterations: int, seed: int
) -> list[dict[str, Any]]:
    """Per held-out group (in the order the tasks first name them): its tasks, each result on them (pass@1,
    Wilson interval) and every policy against the first on them (paired bootstrap), as for the whole set."""
    out = []
    for name in dict.fromkeys(groups.values()):
        restricted = [restrict(r, {i for i, g in groups.items() if g == name}) for r in results]
        out.append(
            {
                "group": name,
                "tasks": sum(1 for g in groups.values() if g == name),
                "results": [{k: v for k, v in r.items() if k != "per_task"} for r in restricted],
                "comparisons": comparisons(restricted, iterations=iterations, seed=seed),
            }
        )
    return out


def first_replies(rollouts: Iterable[dict], rewards: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """Per task, its first rollout (lowest sample index) as a reader sees it: `rollout_id`, `reward` (verify's;
    None when not graded) and `answer` — the final reply (what answer-graded environments score), else the
    patch, clipped to `EXAMPLE_CHARS`."""
    verdicts = {r["rollout_id"]: r for r in rewards}
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(rollouts, key=lambda r: (r["instance_id"], int(r.get("sample_index") or 0))):
        if r["instance_id"] not in out:
            out[r["instance_id"]] = {
                "rollout_id": r["rollout_id"],
                "reward": (verdicts.get(r["rollout_id"]) or {}).get("reward"),
                "answer": clip(str(r.get("final_answer") or r.get("model_patch") or ""), EXAMPLE_CHARS),
            }
    return out


def side_by_side(
    firsts: Mapping[str, Mapping[str, dict[str, Any]]], request: Callable[[str], str], mode: str
) -> dict[str, Any] | None:
    """One held-out request answered by every policy (`firsts`: policy -> `first_replies`, the baseline
    first, the trained policy last): the first task (by id) where the first and the last policy's first
    rollouts differ in reward, else the first task both answered. None with fewer than two policies or no
    task in common."""
    names = list(firsts)
    if len(names) < 2:
        return None
    a, b = firsts[names[0]], firsts[names[-1]]
    common = sorted(set(a) & set(b))
    if not common:
        return None

    def differ(i: str) -> bool:
        ra, rb = a[i]["reward"], b[i]["reward"]
        return ra is not None and rb is not None and ra != rb

    task = next((i for i in common if differ(i)), common[0])
    return {
        "instance_id": task,
        "mode": mode,
        "request": clip(request(task), EXAMPLE_CHARS),
        "replies": [{"policy": p, **firsts[p][task]} for p in names if task in firsts[p]],
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
