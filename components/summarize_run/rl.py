"""Run summary of `harnessrl-full`: tasks kept and selected, the base model's pass rate, what the RL loop did
(steps, groups, reward per step, staleness, throughput, what its replies looked like at the first and the last
step) and what the evaluation measured on the held-out tasks (base vs trained pass@1 with intervals and the
paired difference, and one held-out request answered by both side by side, from evaluation.json), with links
to each stage's report."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from components.evaluate.report import side_by_side_lines
from components.summarize_run.stage import StageRef, _num, _pct, _rate, tasks_table
from harnessrl.io import read_jsonl
from harnessrl.reports import StageReport, embed_png, figure_png, new_figure
from harnessrl.rl.records import StepRecord

STEPS_FILE = "steps.jsonl"  # what the rl_loop step writes into its `tensorboard` artifact


def evaluation_rows(values: dict[str, float]) -> list[dict[str, Any]]:
    """Per (policy, mode): pass@1 and its interval, from the evaluate step's flat metrics
    (`<policy>_<mode>_pass_at_1`, `_pass_at_1_low`, `_pass_at_1_high`, `_graded`, `_resolved`)."""
    rows = []
    for key, value in values.items():
        m = re.fullmatch(r"(.+)_(greedy|sampled)_pass_at_1", key)
        if m is None or "_vs_" in key:
            continue
        prefix = key.removesuffix("_pass_at_1")
        rows.append(
            {
                "policy": m.group(1),
                "mode": m.group(2),
                "pass_at_1": value,
                "low": values.get(f"{prefix}_pass_at_1_low"),
                "high": values.get(f"{prefix}_pass_at_1_high"),
                "graded": values.get(f"{prefix}_graded"),
                "resolved": values.get(f"{prefix}_resolved"),
            }
        )
    return sorted(rows, key=lambda r: (r["mode"], r["policy"] != "base", r["policy"]))


def comparison_rows(values: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for key, value in values.items():
        m = re.fullmatch(r"(.+)_vs_(.+)_(greedy|sampled)_diff", key)
        if m is None:
            continue
        prefix = key.removesuffix("_diff")
        rows.append(
            {
                "b": m.group(1),
                "a": m.group(2),
                "mode": m.group(3),
                "diff": value,
                "low": values.get(f"{prefix}_low"),
                "high": values.get(f"{prefix}_high"),
                "significant": bool(values.get(f"{prefix}_significant")),
            }
        )
    return rows


def plot_run(steps: list[StepRecord], evaluated: list[dict[str, Any]]) -> bytes:
    """Left: reward per RL step (every finished rollout, and the trained groups) and the loss. Right: held-out
    pass@1 per policy with its 95% interval. A panel with nothing to show says why in words."""
    fig, axes = new_figure(3.0, 1, 2)
    left, right = axes[0]
    every = [(s.step, s.collected.reward_all_mean) for s in steps if s.collected.reward_all_mean is not None]
    trained = [(s.step, s.reward_mean) for s in steps if s.reward_mean is not None]
    losses = [(s.step, s.loss) for s in steps if s.loss is not None]
    for points, marker, label in (
        (every, "o", "reward, every finished rollout"),
        (trained, "^", "reward, trained groups"),
        (losses, "s", "loss"),
    ):
        if points:
            left.plot([x for x, _ in points], [v for _, v in points], marker=marker, label=label)
    if every or trained:
        left.legend(fontsize=8)
    else:
        why = "the RL loop recorded no steps" if not steps else "no step finished a rewarded rollout"
        left.text(0.5, 0.5, why, ha="center", va="center", transform=left.transAxes, fontsize=9)
    left.set_title("RL loop, per optimizer step", fontsize=10)
    left.set_xlabel("step", fontsize=8)
    if evaluated:
        labels = [f"{r['policy']}\n({r['mode']})" for r in evaluated]
        values = [r["pass_at_1"] for r in evaluated]
        errors = [
            [v - (r["low"] if r["low"] is not None else v) for r, v in zip(evaluated, values, strict=True)],
            [(r["high"] if r["high"] is not None else v) - v for r, v in zip(evaluated, values, strict=True)],
        ]
        right.bar(range(len(values)), values, yerr=errors, capsize=4, color="#4c72b0")
        right.set_xticks(range(len(values)), labels)
        right.set_ylim(0, 1)
    else:
        right.text(0.5, 0.5, "no policy was evaluated", ha="center", va="center", transform=right.transAxes)
    right.set_title("held-out pass@1 (95% interval)", fontsize=10)
    for ax in (left, right):
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    return figure_png(fig)


FAMILY_NAMES = {
    "swe": "SWE",
    "instruction": "instruction-following",
    "procedural": "procedural (reasoning-gym)",
    "search": "search",
    "kernel": "kernel",
}


def family_name(family: StageRef) -> str | None:
    """The family the task-family step chose, from its one-hot metrics (`family_<name>`)."""
    return next((FAMILY_NAMES[f] for f in FAMILY_NAMES if family.values.get(f"family_{f}")), None)


def harness_names(family: StageRef) -> list[str]:
    """The harnesses the family's rollouts ran through, from its one-hot metrics (`harness_<name>`)."""
    return [k.removeprefix("harness_") for k, v in family.values.items() if k.startswith("harness_") and v]


def verdict_line(compared: list[dict[str, Any]], family: StageRef | None) -> str:
    """The summary's first line: did training help, by the first paired comparison and its interval."""
    if not compared:
        return "**Did training help? Unknown**: the evaluation compared no policies."
    c = compared[0]
    where = ""
    if family is not None and family.values.get("test"):
        where = f" on {family.values['test']:.0f} held-out {family_name(family) or ''} tasks".replace(
            "  ", " "
        )
    if family is not None and (harnesses := harness_names(family)):
        where += f", trained and evaluated through {' + '.join(harnesses)}"
    interval = f"[{_num(c['low'], '{:+.3f}')}, {_num(c['high'], '{:+.3f}')}]"
    change = (
        f"pass@1 {c['b']} − {c['a']} ({c['mode']}) {c['diff']:+.3f}, paired 95% interval {interval}{where}"
    )
    if c["significant"] and c["diff"] > 0:
        return f"**Training helped**: {change}."
    if c["significant"]:
        return f"**Training hurt**: {change}."
    return f"**Training did not measurably help**: {change} (the interval includes 0)."


def family_line(family: StageRef) -> str:
    v = family.values
    name = family_name(family) or "generated"
    if v.get("family_swe"):
        return f"Trained on the selected SWE tasks ({_num(v.get('swe_mixed'), '{:.0f}')} with headroom)."
    if not v.get("auto"):
        return f"Trained on the {name} family, as the run's settings asked."
    return (
        "SWE tasks gave the policy no headroom (it solved none of their estimated rollouts), so the loop "
        f"trained on the {name} family: {_num(v.get('train'), '{:.0f}')} tasks, "
        f"{_num(v.get('test'), '{:.0f}')} held out (never sharing a source with the training tasks)."
    )


def render_rl_summary(
    difficulty: StageRef,
    selection: StageRef,
    loop: StageRef,
    evaluation: StageRef,
    steps: list[StepRecord],
    mode: str,
    family: StageRef | None = None,
    evaluation_json: dict[str, Any] | None = None,
) -> StageReport:
    """`evaluation_json`: the evaluate step's evaluation.json, when the step has it (its `example`: one
    held-out request answered by each policy)."""
    d, s, r = difficulty.values, selection.values, loop.values
    base_rate = _rate(d.get("passes"), d.get("valid_rollouts"))
    evaluated = evaluation_rows(evaluation.values)
    compared = comparison_rows(evaluation.values)
    verdicts = [
        f"{c['b']} − {c['a']} ({c['mode']}): {c['diff']:+.3f} [{_num(c['low'], '{:+.3f}')}, "
        f"{_num(c['high'], '{:+.3f}')}], " + ("significant" if c["significant"] else "not significant")
        for c in compared
    ]
    lines = [
        "# Run summary",
        "",
        verdict_line(compared, family),
        "",
        "Held-out pass@1 after training vs before: " + ("; ".join(verdicts) or "n/a (no comparison)") + ".",
        "",
        *([family_line(family), ""] if family is not None else []),
        *tasks_table(d, s),
        "",
        f"Base model pass rate on every kept task (difficulty estimation, N={_num(d.get('n'), '{:.0f}')} "
        f"each): {_pct(base_rate)}.",
        "",
        "## RL loop",
        "",
        "| mode | steps trained | groups trained | zero-variance groups | reward first → last | loss (last) | "
        "staleness mean / max | partial rollouts | engine idle | train tokens/s | wall |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|",
        f"| {mode} | "
        f"{_num(r.get('steps_trained'), '{:.0f}')} | {_num(r.get('groups_trained'), '{:.0f}')} | "
        f"{_num(r.get('groups_zero_variance'), '{:.0f}')} | {_num(r.get('reward_first'))} → "
        f"{_num(r.get('reward_last'))} | {_num(r.get('loss_last'))} | {_num(r.get('staleness_mean'), '{:.2f}')} / "
        f"{_num(r.get('staleness_max'), '{:.0f}')} | {_num(r.get('partial_rollouts'), '{:.0f}')} | "
        f"{_pct(r.get('engine_idle_frac'))} | {_num(r.get('train_tokens_per_s'), '{:.0f}')} | "
        f"{_num(r.get('wall_s'), '{:.0f}')} s |",
        "",
        "Replies, first → last step: "
        f"{_num(r.get('mean_reply_tokens_first'), '{:.1f}')} → {_num(r.get('mean_reply_tokens_last'), '{:.1f}')} "
        f"sampled tokens per model call, {_pct(r.get('length_finish_share_first'))} → "
        f"{_pct(r.get('length_finish_share_last'))} cut by max_tokens, distinct-2 "
        f"{_num(r.get('distinct_2_first'), '{:.3f}')} → {_num(r.get('distinct_2_last'), '{:.3f}')}.",
        "",
        "## Evaluation (held-out tasks)",
        "",
        "| policy | mode | rollouts graded | resolved | pass@1 | 95% interval |",
        "|---|---|---:|---:|---:|---|",
    ]
    for e in evaluated:
        lines.append(
            f"| {e['policy']} | {e['mode']} | {_num(e['graded'], '{:.0f}')} | {_num(e['resolved'], '{:.0f}')} | "
            f"{_pct(e['pass_at_1'])} | [{_pct(e['low'])}, {_pct(e['high'])}] |"
        )
    if not evaluated:
        lines.append("| n/a | | | | | |")
    lines += [
        "",
        embed_png(plot_run(steps, evaluated), "reward and loss per RL step; held-out pass@1 per policy"),
        "",
        "## One held-out request, base and trained",
        "",
        *(
            side_by_side_lines(evaluation_json.get("example"))
            if evaluation_json is not None
            else ["The evaluation file (evaluation.json) was not given to this step."]
        ),
        "",
        "## Stage reports",
        "",
        "Links open the copies in a local run's `reports/` folder; on a cluster each step's report is the "
        "artifact named.",
        "",
        *(f"- {ref.report_link()}" for ref in (difficulty, selection, loop, evaluation)),
    ]
    trained_rows = [e for e in evaluated if e["policy"] != "base"]
    base_rows = [e for e in evaluated if e["policy"] == "base"]
    metrics = {
        "tasks_kept": d.get("tasks"),
        "tasks_selected": s.get("train"),
        "tasks_held_out": s.get("test"),
        "pass_rate_base_difficulty": base_rate,
        "steps_trained": r.get("steps_trained"),
        "reward_last": r.get("reward_last"),
        "pass_at_1_base": base_rows[0]["pass_at_1"] if base_rows else None,
        "pass_at_1_trained": trained_rows[0]["pass_at_1"] if trained_rows else None,
        "pass_at_1_diff": compared[0]["diff"] if compared else None,
    }
    return StageReport(
        "\n".join(lines) + "\n",
        {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))},
    )


def read_evaluation(path: Path) -> dict[str, Any]:
    """The evaluate step's evaluation.json (any schema version: the summary only shows what it holds)."""
    return json.loads(path.read_text())


def read_steps(artifact_dir: Path) -> list[StepRecord]:
    path = artifact_dir / STEPS_FILE
    return [StepRecord.from_row(row) for row in read_jsonl(path)] if path.is_file() else []
