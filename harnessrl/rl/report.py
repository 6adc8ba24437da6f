"""The RL stage's report: a summary table, curves (reward, loss, staleness, throughput, engine idle time, and
what the sampled replies looked like: tokens per call, the share cut by the reply budget, distinct-2) and the
per-step table; `report.md` embeds `curves.png` so the KFP Markdown viewer shows it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_bytes, atomic_write_text
from harnessrl.reports import code, embed_png, figure_png, new_figure
from harnessrl.rl.config import RLConfig
from harnessrl.rl.records import RLSummary, StepRecord
from harnessrl.train.report import spaced_rows

CURVES: tuple[tuple[str, Callable[[StepRecord], float | None]], ...] = (
    ("reward (trained groups)", lambda r: r.reward_mean),
    ("reward (all finished rollouts)", lambda r: r.collected.reward_all_mean),
    ("loss", lambda r: r.loss),
    ("staleness (versions)", lambda r: None if r.update is None else r.update.staleness_mean),
    ("generated tokens/s", lambda r: r.gen_tokens_per_s),
    ("engine idle fraction", lambda r: r.engine_idle_frac),
    ("reply tokens per model call", lambda r: r.replies.mean_reply_tokens),
    ("share of replies cut by max_tokens", lambda r: r.replies.length_finish_share),
    ("distinct-2 within replies", lambda r: r.replies.distinct_2),
)
NOT_MEASURED = {
    "reward (trained groups)": "no step trained:\nno group had signal",
    "reward (all finished rollouts)": "no rollout finished\nwith a reward",
    "loss": "no step trained",
    "staleness (versions)": "no step trained",
    "engine idle fraction": "the engines report\nno figures (e.g. vLLM)",
    "reply tokens per model call": "no model call\nwas recorded",
    "share of replies cut by max_tokens": "no model call\nwas recorded",
    "distinct-2 within replies": "no reply had two\nor more tokens",
}
TABLE_KEYS = (
    "step",
    "outcome",
    "version",
    "reward_mean",
    "loss",
    "groups_trained",
    "staleness_mean",
    "mean_reply_tokens",
    "length_finish_share",
    "distinct_2",
    "step_s",
)


def plot_curves(records: list[StepRecord], png: Path) -> bytes:
    fig, axes = new_figure(7.2, 3, 3)
    steps = [r.step for r in records]
    marker = "o" if len(records) <= 60 else None
    for ax, (title, value) in zip(axes.flat, CURVES, strict=True):
        values = [math.nan if (v := value(r)) is None else float(v) for r in records]
        if all(math.isnan(v) for v in values):  # say what did not happen instead of an empty chart
            ax.text(0.5, 0.5, NOT_MEASURED.get(title, "not measured"), ha="center", va="center", fontsize=8,
                    transform=ax.transAxes, wrap=True)  # fmt: skip
        else:
            ax.plot(steps, values, marker=marker, ms=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    data = figure_png(fig)
    atomic_write_bytes(png, data)
    return data


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def render(
    summary: RLSummary, records: list[StepRecord], cfg: RLConfig, png: bytes | None, trajectories: str = ""
) -> str:
    lines = [
        "# RL stage",
        "",
        f"Mode {code(cfg.mode)}: {summary.steps} steps ({summary.steps_trained} trained), "
        f"{cfg.batch_groups} groups × {cfg.group_size} rollouts per step, max staleness {cfg.max_staleness}, "
        f"final policy version {summary.version}, {_fmt(summary.wall_s)} s. "
        + (
            f"LoRA adapters of rank {summary.lora_rank} trained (the model written merged, its adapter in "
            "`model/adapter/`)."
            if summary.lora_rank
            else "Every weight trained."
        ),
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {code(k)} | {_fmt(v)} |" for k, v in summary.to_dict().items() if k != "mode"]
    lines.append("")
    if png is not None:
        lines += [embed_png(png, "rl curves"), ""]
    lines += ["| " + " | ".join(TABLE_KEYS) + " |", "|" + "---|" * len(TABLE_KEYS)]
    for r in spaced_rows([r.row() for r in records], 30):
        lines.append("| " + " | ".join(_fmt(r.get(k)) for k in TABLE_KEYS) + " |")
    lines += [
        "",
        "Every step's metrics: `steps.jsonl`; TensorBoard event files: `tensorboard/`; every step's rollouts "
        "(status, reward and its parts, how each ended): `rollouts/step-NNNNNN.jsonl`.",
    ]
    if trajectories:
        lines += ["", "The last step's rollouts, as the policy ran them:", "", trajectories.rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_report(
    out: Path, summary: RLSummary, records: list[StepRecord], cfg: RLConfig, trajectories: str = ""
) -> Path:
    png = plot_curves(records, out / "curves.png") if records else None
    return atomic_write_text(out / "report.md", render(summary, records, cfg, png, trajectories))
