"""Markdown report with training curves (PNG beside it, and embedded for KFP's Markdown viewer)."""

from __future__ import annotations

import math
from pathlib import Path

from harnessrl.io import atomic_write_bytes, atomic_write_text
from harnessrl.reports import code, embed_png, figure_png, new_figure

CURVES = (
    ("loss", "loss"),
    ("reward_mean", "reward mean (step's rollouts)"),
    ("entropy", "entropy"),
    ("grad_norm", "grad norm"),
    ("clip_frac", "clip fraction"),
    ("tokens_per_s", "tokens/s"),
)


HISTORY_TABLE_ROWS = 30  # a longer run's table shows evenly spaced steps (all of them are in steps.jsonl)


def plot_curves(history: list[dict], png: Path) -> Path:
    fig, axes = new_figure(4.8, 2, 3)
    steps = [h["step"] for h in history]
    marker = "o" if len(history) <= 60 else None  # a long run: lines only
    for ax, (key, title) in zip(axes.flat, CURVES, strict=True):
        ax.plot(steps, [h.get(key, math.nan) for h in history], marker=marker, ms=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    atomic_write_bytes(png, figure_png(fig))
    return png


def spaced_rows(rows: list[dict], limit: int) -> list[dict]:
    """At most `limit` rows, evenly spaced, first and last included."""
    if len(rows) <= limit:
        return rows
    picks = sorted({round(i * (len(rows) - 1) / (limit - 1)) for i in range(limit)})
    return [rows[i] for i in picks]


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render(summary: dict, history: list[dict], cfg, png: Path | None) -> str:
    lines = ["# GRPO train stage", ""]
    t = cfg.train
    lines += [
        f"Estimator {code(cfg.estimator)} at {code(cfg.advantage_level)} level, loss aggregation "
        f"{code(t.loss_mode)}, clip ε=({t.policy.clip_low}, {t.policy.clip_high}), dual clip "
        f"{t.policy.dual_clip_c}, TIS cap {t.policy.tis_cap}, lr {t.optim.lr}, "
        f"{'packed' if t.packing else 'padded'} micro-batches, {t.precision}, seed {t.seed}.",
        "",
    ]
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {code(k)} | {_fmt(v)} |" for k, v in summary.items() if not isinstance(v, dict | list)]
    lines.append("")
    if png is not None and png.exists():
        lines += [embed_png(png.read_bytes(), "training curves"), ""]
    if history:
        keys = (
            "step",
            "loss",
            "reward_mean",
            "adv_std",
            "entropy",
            "clip_frac",
            "grad_norm",
            "tokens_per_s",
            "padding_fraction",
        )
        shown = spaced_rows(history, HISTORY_TABLE_ROWS)
        if len(shown) < len(history):
            lines += [f"{len(shown)} of {len(history)} steps, evenly spaced (all steps: `steps.jsonl`).", ""]
        lines += ["| " + " | ".join(code(k) for k in keys) + " |", "|" + "---:|" * len(keys)]
        lines += ["| " + " | ".join(_fmt(h.get(k)) for k in keys) + " |" for h in shown]
    return "\n".join(lines) + "\n"


def write_report(out: Path, summary: dict, history: list[dict], cfg) -> Path:
    png = plot_curves(history, out / "curves.png") if history else None
    path = out / "report.md"
    atomic_write_text(path, render(summary, history, cfg, png))
    return path
