"""LoRA vs full fine-tuning through the whole stack: the same family, steps and seed, one run each.

As a user runs it: the demo's family (whole one-sentence replies of `--min-words` words holding a word of the
request, IFEval's placeholders constraint, `instruction_strict`, the chat harness, `--reply-tokens` replies;
held out: half trained kinds, half kinds never trained), then `harnessrl stage rl` twice from the same base,
tasks and seed with the demo's loop (Dr. GRPO, token losses summed over the reply budget, colocated, the
in-process engine): full fine-tuning at `--lr`, and LoRA (`train.lora`: `--rank`, `--alpha`, every linear
projection) at `--lora-lr` — adapters learn at a larger step than whole weights. Then `harnessrl stage evaluate`
of the base and both policies on the held-out requests (sampled, `--k` per task): trained − base with the paired
95% interval over tasks.

Per run, measured: the stage's peak resident memory (the process holds the engine and the trainer: the
difference is the trainer's weights' gradients and AdamW state), AdamW's state bytes (two fp32 moments per
trained parameter, counted on the model), the bytes and seconds of each weight sync into the engine (the
adapter alone for LoRA: the engine merges it, harnessrl/engine/local.py) and each step's seconds (`step_s`,
and the trainer's `train_s`), from the run's steps.jsonl. Ratios are LoRA / full. Adapter sync into vLLM is
measured by the vLLM tests, not here: the local engine is the one this machine's loop runs.

    .venv/bin/python benchmarks/lora.py --out runs/lora                  # 6 steps each, ~25 min on 2 quiet cores
    .venv/bin/python benchmarks/lora.py --out runs/lora --lora-lr 1e-3   # LoRA again at another rate (the rest kept)
    .venv/bin/python benchmarks/lora.py --smoke         # 1 step each, 1 held-out task (~2 min)

Last line: JSON with `full_diff`, `full_ci_low`, `lora_diff`, `lora_ci_low` (and `_ci_high`, `_pass_at_1`,
`base_pass_at_1`), `trainer_peak_rss_ratio`, `optimizer_state_bytes_ratio`, `sync_bytes_ratio`,
`sync_seconds_ratio`, `step_time_ratio`, `train_time_ratio`, each run's figures under `full` and `lora`, and
`minutes`. `--smoke` figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.ablation_rollout_level import same_settings_as_before
from benchmarks.learning_envs import (
    REPO,
    add_family_arguments,
    evaluate_policies,
    instruction_tasks,
    paired_figures,
)
from harnessrl.io import read_jsonl

logger = logging.getLogger(__name__)

RUNS = ("full", "lora")


def rl_config(args: argparse.Namespace, lora: bool) -> dict[str, Any]:
    """The demo's loop settings (pipelines/demo.py says why), with LoRA's adapters and learning rate."""
    from pipelines.demo import DEMO_RL_CONFIG

    config = json.loads(DEMO_RL_CONFIG)
    config["train"].update(
        loss_scale_factor=args.reply_tokens, optim={"lr": args.lora_lr if lora else args.lr}
    )
    if lora:
        config["train"]["lora"] = {"rank": args.rank, "alpha": args.alpha}
    return config


def peak_rss_run(*args: str) -> int:
    """Runs `harnessrl ARGS` as harnessrl() does; the process's own peak resident bytes (wait4's rusage)."""
    cmd = [sys.executable, "-m", "harnessrl.cli", "--no-progress", *args]
    logger.info("$ harnessrl %s", " ".join(args))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"harnessrl {' '.join(args[:3])} failed ({proc.returncode}): {tail}")
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def optimizer_state_bytes(args: argparse.Namespace, lora: bool) -> int:
    """AdamW's state for the trained parameters: two fp32 moments each."""
    from harnessrl.tinymodel import tiny_model_dir
    from harnessrl.train.lora import LoraSettings, load_trainable

    settings = LoraSettings(rank=args.rank, alpha=args.alpha) if lora else LoraSettings()
    model = load_trainable(tiny_model_dir(), None, settings)
    return 2 * 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def run_folder(name: str, args: argparse.Namespace, root: Path) -> Path:
    """A run's folder, named by what it trains with: a rerun with another LoRA rate trains only LoRA again."""
    if name == "lora":
        return root / f"rl-lora-r{args.rank}-a{args.alpha}-lr{args.lora_lr:g}"
    return root / f"rl-full-lr{args.lr:g}"


def train(name: str, args: argparse.Namespace, tasks: Path, root: Path) -> dict[str, Any]:
    """One RL run; its figures (kept in the run folder: a rerun into it does not train again)."""
    out = run_folder(name, args, root)
    figures_file = out / "lora_benchmark.json"
    if figures_file.is_file():
        logger.info("%s: trained already", out)
        return json.loads(figures_file.read_text())
    config = root / f"{out.name}.json"
    config.write_text(json.dumps(rl_config(args, name == "lora")))
    started = time.perf_counter()
    peak = peak_rss_run(
        "stage", "rl", "--tasks", str(tasks), "--out", str(out), "--mode", "colocated",
        "--steps", str(args.steps), "--batch-groups", str(args.batch_groups), "--group-size", str(args.group_size),
        "--specs", specs(args), "--config", str(config), "--seed", str(args.seed),
    )  # fmt: skip
    rows = [r for r in read_jsonl(out / "steps.jsonl") if r["outcome"] == "trained"]
    figures = {
        "peak_rss_bytes": peak,
        "optimizer_state_bytes": optimizer_state_bytes(args, name == "lora"),
        "sync_bytes": mean([r["weight_sync_bytes"] for r in rows]),
        "sync_s": mean([r["weight_sync_s"] for r in rows]),
        "step_s": mean([r["step_s"] for r in rows]),
        "train_s": mean([r["train_s"] for r in rows]),
        "reward_per_step": [r.get("reward_all_mean") for r in read_jsonl(out / "steps.jsonl")],
        "trained_steps": len(rows),
        "minutes": round((time.perf_counter() - started) / 60, 2),
    }
    figures_file.write_text(json.dumps(figures))
    return figures


# the settings the tasks, the base and each run's evaluation depend on (the learning rates and rank name the runs)
SETTING_FLAGS = (
    "kinds", "train_tasks", "heldout_tasks", "steps", "batch_groups", "group_size", "reply_tokens", "min_words",
    "k", "seed",
)  # fmt: skip


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def specs(args: argparse.Namespace) -> str:
    return json.dumps(
        [{"harness": "chat", "reward": "instruction_strict", "limits": {"tokens": args.reply_tokens}}]
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_family_arguments(p, k=4)
    p.add_argument("--lora-lr", type=float, default=3e-4, help="LoRA's learning rate")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument(
        "--out", type=Path, help="run folder (default: a temporary one); a rerun keeps what is done"
    )
    p.add_argument(
        "--smoke", action="store_true", help="1 step each, 1 held-out task (the figures mean nothing)"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.smoke:
        args.train_tasks, args.heldout_tasks, args.steps, args.batch_groups = 2, 1, 1, 1
        args.group_size, args.k, args.reply_tokens = 4, 1, 16
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lora-") as scratch:
        root = args.out or Path(scratch)
        same_settings_as_before(root, args, SETTING_FLAGS)
        train_tasks, test_tasks, _ = instruction_tasks(args, root / "tasks")
        runs = {name: train(name, args, train_tasks, root) for name in RUNS}
        policies: dict[str, Path | None] = {"base": None}
        policies.update(
            {run_folder(name, args, root).name: run_folder(name, args, root) / "model" for name in RUNS}
        )
        by_folder = evaluate_policies(policies, specs(args), args, test_tasks, root / "eval")
        results = {
            "base": by_folder["base"],
            **{name: by_folder[run_folder(name, args, root).name] for name in RUNS},
        }
    out: dict[str, Any] = {}
    for name in RUNS:
        out.update(paired_figures(results["base"], results[name], name, args.seed))
    full, lora = runs["full"], runs["lora"]
    out.update(
        trainer_peak_rss_ratio=ratio(lora["peak_rss_bytes"], full["peak_rss_bytes"]),
        optimizer_state_bytes_ratio=ratio(lora["optimizer_state_bytes"], full["optimizer_state_bytes"]),
        sync_bytes_ratio=ratio(lora["sync_bytes"], full["sync_bytes"]),
        sync_seconds_ratio=ratio(lora["sync_s"], full["sync_s"]),
        step_time_ratio=ratio(lora["step_s"], full["step_s"]),
        train_time_ratio=ratio(lora["train_s"], full["train_s"]),
        full=full,
        lora=lora,
    )
    for name in RUNS:
        run = runs[name]
        print(
            f"{name}: held-out {out['base_pass_at_1']:.3f} -> {out[f'{name}_pass_at_1']:.3f}, "
            f"diff {out[f'{name}_diff']:+.3f} [{out[f'{name}_ci_low']:+.3f}, {out[f'{name}_ci_high']:+.3f}]; "
            f"peak {run['peak_rss_bytes'] / 1e9:.2f} GB, AdamW state {run['optimizer_state_bytes'] / 1e6:.1f} MB, "
            f"sync {run['sync_bytes'] or 0:.3g} B in {run['sync_s'] or 0:.3f} s, step {run['step_s'] or 0:.1f} s "
            f"(trainer {run['train_s'] or 0:.1f} s), reward per step {run['reward_per_step']}",
            flush=True,
        )
    out.update(minutes=round((time.perf_counter() - started) / 60, 2), load_avg=os.getloadavg()[0])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
