"""Run summary as the pipeline runs it: after each round, the numbers of the run so far in one report.

Tasks kept and selected, pass rates of the base model and of each round's policy, reward and loss per round,
throughput, and where each stage's own report is. A round's numbers come from its steps' Metrics artifacts;
the rounds so far travel from one summary step to the next as `rounds.jsonl` (rounds are unrolled at compile
time, so no single step could take every round's artifacts as a list).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_output, read_jsonl, write_jsonl
from harnessrl.reports import StageReport, code, embed_png, figure_png, new_figure

ROUNDS_FILE = "rounds.jsonl"


@dataclass
class StageRef:
    """A step's numbers and where its report is: `uri` of its Metrics artifact; the report is beside it."""

    label: str
    uri: str
    values: dict[str, float] = field(default_factory=dict)

    def report_link(self) -> str:
        """Local runs: a link into the run's reports/ folder (`harnessrl run` writes <task>.html there).
        Elsewhere: the URI of the step's HTML report artifact (next to its Metrics artifact)."""
        base, _, _ = self.uri.rpartition("/")
        if "://" in self.uri:
            return f"{self.label}: {code(base + '/report_html')}"
        return f"[{self.label}]({Path(base).name}.html)"


@dataclass
class RoundRecord:
    round: int
    generate: StageRef
    verify: StageRef
    train: StageRef

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> RoundRecord:
        return cls(row["round"], *(StageRef(**row[k]) for k in ("generate", "verify", "train")))


def read_metrics(artifact: Any, label: str) -> StageRef:
    """A Metrics input's numbers: its metadata (log_metric), else its file (JSON written by `publish`)."""
    values = dict(getattr(artifact, "metadata", None) or {})
    if not values and Path(artifact.path).is_file():
        with contextlib.suppress(json.JSONDecodeError):
            values = json.loads(Path(artifact.path).read_text())
    numeric = {
        k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return StageRef(label, str(artifact.uri), numeric)


def read_rounds(earlier: Path | None) -> list[RoundRecord]:
    if earlier is None or not (earlier / ROUNDS_FILE).is_file():
        return []
    return [RoundRecord.from_dict(row) for row in read_jsonl(earlier / ROUNDS_FILE)]


def _rate(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _pct(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str = "{:.4g}") -> str:
    return "n/a" if value is None or not math.isfinite(value) else fmt.format(value)


def round_pass_rate(r: RoundRecord) -> float | None:
    return _rate(r.verify.values.get("resolved"), r.verify.values.get("graded"))


def plot_rounds(rounds: list[RoundRecord]) -> bytes:
    """Pass rate and reward mean per round; training loss at the first and last step of each round."""
    fig, axes = new_figure(3.0, 1, 2)
    xs = [r.round for r in rounds]
    left, right = axes[0]
    left.plot(xs, [round_pass_rate(r) or math.nan for r in rounds], marker="o", label="pass rate")
    left.plot(
        xs, [r.verify.values.get("reward_mean", math.nan) for r in rounds], marker="s", label="reward mean"
    )
    left.set_title("rollouts per round", fontsize=10)
    right.plot(
        xs, [r.train.values.get("loss_first", math.nan) for r in rounds], marker="o", label="first step"
    )
    right.plot(xs, [r.train.values.get("loss", math.nan) for r in rounds], marker="s", label="last step")
    right.set_title("training loss per round", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("round", fontsize=8)
        ax.set_xticks(xs)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return figure_png(fig)


def tasks_table(difficulty: dict[str, float], selection: dict[str, float]) -> list[str]:
    """The "Tasks" section: what clean/validate kept, how difficulty split it, what select chose."""
    d, s = difficulty, selection
    return [
        "## Tasks",
        "",
        "| tasks | count |",
        "|---|---:|",
        f"| kept by clean + validate (estimated) | {_num(d.get('tasks'), '{:.0f}')} |",
        f"| mixed (some rollouts pass) | {_num(d.get('mixed'), '{:.0f}')} |",
        f"| always pass (dropped) | {_num(d.get('all_pass'), '{:.0f}')} |",
        f"| always fail | {_num(d.get('all_fail'), '{:.0f}')} |",
        f"| selected for training | {_num(s.get('train'), '{:.0f}')} |",
        f"| held out | {_num(s.get('test'), '{:.0f}')} |",
    ]


def render(
    difficulty: StageRef, selection: StageRef, rounds: list[RoundRecord], total_rounds: int
) -> StageReport:
    d, s = difficulty.values, selection.values
    base_rate = _rate(d.get("passes"), d.get("valid_rollouts"))
    last = rounds[-1]
    last_rate = round_pass_rate(last)
    done = "all rounds" if last.round >= total_rounds else f"round {last.round} of {total_rounds}"
    lines = [
        f"# Run summary ({done})",
        "",
        f"Pass rate {_pct(base_rate)} before training (base model, difficulty estimation) → "
        f"{_pct(last_rate)} in round {last.round}'s rollouts"
        + (" (the base model)" if last.round == 1 else f" (the policy trained in round {last.round - 1})")
        + ". The first is measured on every kept task, the others on the selected training tasks, "
        "which exclude the tasks the base model always solved.",
        "",
        *tasks_table(d, s),
        "",
        "## Pass rate and reward",
        "",
        "| policy | tasks | rollouts graded | passed | pass rate | reward mean |",
        "|---|---|---:|---:|---:|---:|",
        f"| base model | kept (N={_num(d.get('n'), '{:.0f}')} each) | {_num(d.get('valid_rollouts'), '{:.0f}')} | "
        f"{_num(d.get('passes'), '{:.0f}')} | {_pct(base_rate)} | n/a |",
    ]
    for r in rounds:
        policy = "base model" if r.round == 1 else f"after round {r.round - 1}"
        v = r.verify.values
        lines.append(
            f"| round {r.round} ({policy}) | selected | {_num(v.get('graded'), '{:.0f}')} | "
            f"{_num(v.get('resolved'), '{:.0f}')} | {_pct(round_pass_rate(r))} | {_num(v.get('reward_mean'))} |"
        )
    lines += ["", embed_png(plot_rounds(rounds), "pass rate, reward and loss per round"), ""]
    lines += [
        "## Training and throughput",
        "",
        "| round | optimizer steps | loss first → last | rollouts | rollouts/hour | verifications/min | "
        "train tokens/s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rounds:
        g, v, t = r.generate.values, r.verify.values, r.train.values
        lines.append(
            f"| {r.round} | {_num(t.get('steps'), '{:.0f}')} | {_num(t.get('loss_first'))} → {_num(t.get('loss'))} | "
            f"{_num(g.get('rollouts'), '{:.0f}')} | {_num(g.get('rollouts_per_hour'), '{:.0f}')} | "
            f"{_num(v.get('verifications_per_min'), '{:.1f}')} | {_num(t.get('tokens_per_s'), '{:.0f}')} |"
        )
    lines += [
        "",
        "## Stage reports",
        "",
        "Links open the copies in a local run's `reports/` folder; on a cluster each step's report is the "
        "artifact named.",
        "",
        f"- {difficulty.report_link()}",
        f"- {selection.report_link()}",
    ]
    for r in rounds:
        lines.append(
            f"- round {r.round}: " + ", ".join(x.report_link() for x in (r.generate, r.verify, r.train))
        )
    metrics = {
        "rounds": float(len(rounds)),
        "tasks_kept": d.get("tasks"),
        "tasks_selected": s.get("train"),
        "pass_rate_base": base_rate,
        "pass_rate_last_round": last_rate,
        "reward_mean_last_round": last.verify.values.get("reward_mean"),
    }
    return StageReport("\n".join(lines) + "\n", {k: v for k, v in metrics.items() if v is not None})


def run_summary(
    difficulty: StageRef,
    selection: StageRef,
    this_round: RoundRecord,
    earlier: Path | None,
    out: Path,
    *,
    total_rounds: int,
) -> StageReport:
    """Appends `this_round` to the earlier rounds (a rerun of a round replaces it), writes them to
    <out>/rounds.jsonl and returns the report of the run so far."""
    rounds = [r for r in read_rounds(earlier) if r.round != this_round.round] + [this_round]
    rounds.sort(key=lambda r: r.round)
    with atomic_output(out) as tmp:
        tmp.mkdir(parents=True)
        write_jsonl(tmp / ROUNDS_FILE, (asdict(r) for r in rounds))
    return render(difficulty, selection, rounds, total_rounds)
