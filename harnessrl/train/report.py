"""Markdown report with training curves (PNG beside it, and embedded for KFP's Markdown viewer)."""

from __future__ import annotations

import base64
import math
from pathlib import Path

from harnessrl.io import atomic_write_bytes, atomic_write_text

CURVES = (
    ("loss", "loss"),
    ("reward_mean", "reward mean (step's rollouts)"),
    ("entropy", "entropy"),
    ("grad_norm", "grad norm"),
    ("clip_frac", "clip fraction"),
    ("tokens_per_s", "tokens/s"),
)


def plot_curves(history: list[dict], png: Path) -> Path:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    steps = [h["step"] for h in history]
    for ax, (key, title) in zip(axes.flat, CURVES, strict=True):
        ax.plot(steps, [h.get(key, math.nan) for h in history], marker="o", ms=3)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(png, buf.getvalue())
    return png


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render(summary: dict, history: list[dict], cfg, png: Path | None) -> str:
    lines = ["# GRPO train stage", ""]
    t = cfg.train
    lines += [
        f"Estimator **{cfg.estimator}** at **{cfg.advantage_level}** level, loss aggregation "
        f"**{t.loss_mode}**, clip ε=({t.policy.clip_low}, {t.policy.clip_high}), dual clip "
        f"{t.policy.dual_clip_c}, TIS cap {t.policy.tis_cap}, lr {t.optim.lr}, "
        f"{'packed' if t.packing else 'padded'} micro-batches, {t.precision}, seed {t.seed}.",
        "",
    ]
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items() if not isinstance(v, dict | list)]
    lines.append("")
    if png is not None and png.exists():
        data = base64.b64encode(png.read_bytes()).decode()
        lines += [f"![training curves](data:image/png;base64,{data})", ""]
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
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(_fmt(h.get(k)) for k in keys) + " |" for h in history]
    return "\n".join(lines) + "\n"


def write_report(out: Path, summary: dict, history: list[dict], cfg) -> Path:
    png = plot_curves(history, out / "curves.png") if history else None
    path = out / "report.md"
    atomic_write_text(path, render(summary, history, cfg, png))
    return path
