"""The evaluate stage's Markdown report and its plot (pass@1 per policy with the Wilson 95% interval), what
each policy's replies looked like, the held-out groups apart, and one request answered side by side (also the
run summary's: `side_by_side_lines`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.evaluate.results import describe
from harnessrl.reports import code, counts_text, embed_png, figure_png, new_figure
from harnessrl.rollout.trajectories import fenced

MAX_LISTED_TASKS = 30


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def pass_at_1_png(results: list[dict[str, Any]]) -> bytes:
    labels = [f"{r['policy']} ({r['mode']})" for r in results]
    values = [r["pass_at_1"] or 0.0 for r in results]
    lows = [max(0.0, v - r["pass_at_1_ci"][0]) for v, r in zip(values, results, strict=True)]
    highs = [max(0.0, r["pass_at_1_ci"][1] - v) for v, r in zip(values, results, strict=True)]
    fig, axes = new_figure(0.45 * max(len(labels), 1) + 1.4)
    ax = axes[0][0]
    ax.barh(labels, values, xerr=[lows, highs], color="#4c72b0", ecolor="#222222", capsize=4)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("pass@1 (bars: Wilson 95% interval)")
    ax.set_title("evaluate: pass@1 per policy")
    return figure_png(fig)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def pass_at_1_table(results: list[dict[str, Any]]) -> list[str]:
    """pass@1 with its interval per policy and mode (a held-out group's too)."""
    lines = ["| policy | mode | pass@1 [95% CI] | resolved / graded |", "|---|---|---|---:|"]
    for r in results:
        low, high = r["pass_at_1_ci"]
        lines.append(
            f"| {code(r['policy'])} | {r['mode']} | {_num(r['pass_at_1'])} [{low:.3f}, {high:.3f}] | "
            f"{r['resolved']} / {r['graded']} |"
        )
    return lines


def replies_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| policy | mode | tokens per model call | cut by max_tokens | distinct-2 |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        tokens = r.get("mean_reply_tokens")
        lines.append(
            f"| {code(r['policy'])} | {r['mode']} | {'n/a' if tokens is None else f'{tokens:.1f}'} | "
            f"{_pct(r.get('length_finish_share'))} | {_num(r.get('distinct_2'))} |"
        )
    return lines


def reward_parts_table(results: list[dict[str, Any]]) -> list[str]:
    """Each reward part's mean per policy and mode (rows: parts; none where no reward has parts)."""
    parts = sorted({p for r in results for p in r.get("reward_parts") or {}})
    if not parts:
        return []
    lines = [
        "| part | " + " | ".join(f"{code(r['policy'])} ({r['mode']})" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for part in parts:
        means = [(r.get("reward_parts") or {}).get(part) for r in results]
        lines.append(f"| {code(part)} | " + " | ".join(_pct(m) for m in means) + " |")
    return lines


def side_by_side_lines(example: dict[str, Any] | None) -> list[str]:
    """One held-out request and each policy's first reply to it, with its reward (evaluation.json's
    `example`)."""
    if not example:
        return ["No request was answered by two policies: nothing to set side by side."]
    lines = [
        f"Task {code(example['instance_id'])} ({example['mode']}; each policy's first rollout — the first task "
        "where the baseline's and the last policy's rewards differ, else the first task):",
        "",
        "Request:",
        "",
        fenced(example["request"]),
    ]
    for reply in example["replies"]:
        reward = "not graded" if reply["reward"] is None else f"reward {reply['reward']:.3g}"
        lines += ["", f"**{reply['policy']}** ({reward}):", "", fenced(reply["answer"] or "(empty reply)")]
    return lines


def render_report(evaluation: dict[str, Any], out: Path) -> str:
    results = evaluation["results"]
    png = pass_at_1_png(results)
    (out / "pass_at_1.png").write_bytes(png)
    ks = sorted({int(k) for r in results for k in r["pass_at_k"] if k != "1"})
    lines = [
        "# Evaluation",
        "",
        f"{evaluation['tasks']['count']} tasks from {code(evaluation['tasks']['path'])}; modes "
        f"{', '.join(evaluation['modes'])} (sampled: k={evaluation['k']} rollouts per task, greedy: 1); "
        f"seed {evaluation['seed']}. Rollouts with an infrastructure error are left out of every rate.",
        "",
        embed_png(png, "pass@1 per policy"),
        "",
        "| policy | mode | pass@1 [95% CI] | " + "".join(f"pass@{k} | " for k in ks) + "resolved / graded |",
        "|---|---|---|" + "---:|" * len(ks) + "---:|",
    ]
    for r in results:
        low, high = r["pass_at_1_ci"]
        cells = [code(r["policy"]), r["mode"], f"{_num(r['pass_at_1'])} [{low:.3f}, {high:.3f}]"]
        cells += [_num((r["pass_at_k"].get(str(k)) or {}).get("value")) for k in ks]
        cells.append(f"{r['resolved']} / {r['graded']}")
        lines.append("| " + " | ".join(cells) + " |")
    if evaluation["comparisons"]:
        lines += ["", "## Differences (paired bootstrap over tasks)", ""]
        lines += [f"- {describe(c)}" for c in evaluation["comparisons"]]
    for g in evaluation.get("groups") or []:
        lines += [
            "",
            f"## Held-out group {code(g['group'])} ({g['tasks']} tasks)",
            "",
            *pass_at_1_table(g["results"]),
        ]
        if g["comparisons"]:
            lines += ["", *(f"- {describe(c)}" for c in g["comparisons"])]
    lines += [
        "",
        "## Replies",
        "",
        "Over every model call of the policy's rollouts (gateway records): sampled tokens per call, the share "
        "the reply budget cut off (finish reason `length`), and distinct-2 (distinct token bigrams ÷ all "
        "bigrams, within each reply; low: replies repeat themselves).",
        "",
        *replies_table(results),
    ]
    if parts := reward_parts_table(results):
        lines += [
            "",
            "## Reward parts",
            "",
            "What each policy's replies met, part by part (the mean of each part of the reward over the graded "
            "rollouts that have it; an instruction task's parts are its constraints' kinds and `on_task`, the "
            "guard).",
            "",
            *parts,
        ]
    lines += [
        "",
        "## One request, side by side",
        "",
        *side_by_side_lines(evaluation.get("example")),
    ]
    lines += ["", "## Per repository", "", "| policy | mode | repo | tasks | resolved tasks | pass@1 |"]
    lines.append("|---|---|---|---:|---:|---:|")
    for r in results:
        for repo, c in r["per_repo"].items():
            cells = [code(r["policy"]), r["mode"], code(repo), str(c["tasks"]), str(c["tasks_resolved"])]
            lines.append("| " + " | ".join([*cells, _num(c["pass_at_1"])]) + " |")
    lines += ["", "## Endings and errors", ""]
    for r in results:
        lines += [
            f"**{r['policy']} ({r['mode']})**: finish reasons {counts_text(r['finish_reasons'])}; "
            f"verify {counts_text(r['verify_status'])}; excluded {counts_text(r['excluded'])}.",
            "",
        ]
        lines += [f"- {n}× {code(e)}" for e, n in r["errors"].items()]
        if r["errors"]:
            lines.append("")
    lines += ["## Resolved tasks", ""]
    for r in results:
        shown = r["resolved_tasks"][:MAX_LISTED_TASKS]
        more = len(r["resolved_tasks"]) - len(shown)
        listed = ", ".join(code(i) for i in shown) or "none"
        lines.append(
            f"- **{r['policy']} ({r['mode']})**: {len(r['resolved_tasks'])} of {r['tasks']}: {listed}"
            + (f" (+{more} more in evaluation.json)" if more > 0 else "")
        )
    return "\n".join(lines) + "\n"
