"""RL loop modes, measured: sync vs colocated async vs separate async on this machine, same trained groups.

Workload: the learning check's task (benchmarks/learning_check.py) as prompt tasks — "Reply with only the word
'X' and nothing else.", reward 1 if the reply contains X — run through the real loop (`harnessrl.rl.loop.run_rl`:
LocalEngine on SmolLM2-135M-Instruct, the recording gateway, rollout threads, the GRPO trainer, in-place weight
sync). Answer lengths are long-tailed by nature at T=1: most replies are a few tokens, some ramble to the
`--max-tokens` cap, so a sync batch waits for its slowest rollout while the engine decodes one or two rows.

Each mode trains `--steps` × `--batch-groups` groups, `--reps` times with the mode order alternating (the
ratios are medians of same-repetition ratios, since this shared machine's load drifts) (groups without reward variance are replaced, not
counted). Reported per mode: wall-clock, engine idle fraction (1 − forward-pass time / wall), staleness, partial
rollouts, the reward curve. Held-out reward (8 unseen words, T=1) of the base model and of the colocated run's
final model gives `reward_gain_colocated`. Calibration for benchmarks/async_sim.py (`--calibration`) is written
to `--calibration-out`: decode/prefill tokens per second of the engine's forward passes, trainer tokens per
second, weight sync seconds (colocated run).

    nice -n 5 .venv/bin/python benchmarks/rl_modes.py [--steps 4] [--modes sync,colocated,separate] [--smoke]

Last line: JSON with colocated_wall_ratio_vs_sync, separate_wall_ratio_vs_sync, reward_gain_colocated and the
calibration block. Run it under `nice` on a quiet machine if you can; the load average is printed.
`--smoke`: every mode, one step of one group of 4, replies capped at 8 tokens, one repetition (the figures
mean nothing; the calibration goes to the run's folder, not over `--calibration-out`'s default).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from learning_check import TRAIN_WORDS, evaluate, prompt_text

from harnessrl.rl.config import RLConfig, RLInputs
from harnessrl.rl.loop import run_rl
from harnessrl.rl.modes import RLMode, WorkloadKind


def write_tasks(path: Path) -> Path:
    rows = [{"task_id": w, "prompt": prompt_text(w), "answer": w} for w in TRAIN_WORDS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def heldout(model_dir: Path | None, n: int, max_new: int) -> float:
    import torch

    from harnessrl.tinymodel import load_model, load_tokenizer

    tok = load_tokenizer()
    model = load_model(model_dir)
    with torch.no_grad():
        return evaluate(model, tok, n, max_new, seed=10_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48, help="reply cap (the long tail's length)")
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--eval-n", type=int, default=4, help="held-out samples per word")
    ap.add_argument("--modes", default=",".join(RLMode))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2, help="repetitions, mode order alternating")
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temp dir, removed)")
    ap.add_argument(
        "--calibration-out",
        type=Path,
        help=f"default: {Path(tempfile.gettempdir()) / 'rl_modes_calibration.json'} (--smoke: in the run's folder)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="every mode, one step of one group of 4, 8-token replies"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.smoke:
        args.steps, args.batch_groups, args.group_size, args.max_tokens = 1, 1, 4, 8
        args.eval_n, args.reps = 1, 1
    modes = [RLMode(m) for m in args.modes.split(",")]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    root = args.out or Path(tempfile.mkdtemp(prefix="rl-modes-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.calibration_out is None:
        # a smoke run's figures mean nothing: they must not replace a real run's calibration
        folder = root if args.smoke else Path(tempfile.gettempdir())
        args.calibration_out = folder / "rl_modes_calibration.json"
    tasks = write_tasks(root / "tasks.jsonl")
    t0 = time.perf_counter()
    base = heldout(None, args.eval_n, args.max_tokens)
    print(f"held-out reward, base model: {base:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)

    runs: dict[RLMode, list[dict]] = {m: [] for m in modes}
    for rep in range(args.reps):  # alternate the order so a load change hits every mode alike
        for mode in modes if rep % 2 == 0 else list(reversed(modes)):
            cfg = RLConfig.from_dict(
                {
                    "mode": mode,
                    "steps": args.steps,
                    "batch_groups": args.batch_groups,
                    "group_size": args.group_size,
                    "prompt_max_tokens": args.max_tokens,
                    "seed": args.seed,
                    "train": {"seed": args.seed, "optim": {"lr": args.lr}},
                }
            )
            out = root / f"{mode}-{rep}"
            print(f"--- {mode}, repetition {rep + 1} (load {os.getloadavg()[0]:.1f})", flush=True)
            result = run_rl(cfg, RLInputs(WorkloadKind.PROMPT, tasks, out), echo=print)
            assert result is not None  # one trainer rank: this process
            summary = result.to_dict()
            rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
            summary["reward_curve"] = [r.get("reward_all_mean") for r in rows]
            summary["load_avg"] = os.getloadavg()[0]
            runs[mode].append(summary)
    results = {m: rs[0] for m, rs in runs.items()}

    gain = None
    if RLMode.COLOCATED in results:
        trained = heldout(root / "colocated-0" / "model", args.eval_n, args.max_tokens)
        gain = trained - base
        print(f"held-out reward, colocated final model: {trained:.3f} (base {base:.3f})", flush=True)

    keys = ("wall_s", "groups_trained", "engine_idle_frac", "staleness_mean", "staleness_max", "partial_rollouts",
            "groups_zero_variance", "weight_sync_s", "train_s")  # fmt: skip
    print("\n| mode | " + " | ".join(keys) + " | reward curve (all finished rollouts per step) |")
    print("|---" * (len(keys) + 2) + "|")
    for mode, rs in runs.items():
        for rep, s in enumerate(rs):
            cells = [f"{s.get(k):.3g}" if isinstance(s.get(k), float) else str(s.get(k)) for k in keys]
            curve = " ".join(f"{x:.2f}" if x is not None else "-" for x in s["reward_curve"])
            print(f"| {mode} #{rep + 1} | " + " | ".join(cells) + f" | {curve} |")

    def ratio(mode: RLMode) -> float | None:
        """Median over repetitions of this mode's wall-clock over sync's in the same repetition."""
        if mode not in runs or RLMode.SYNC not in runs:
            return None
        return round(
            statistics.median(
                a["wall_s"] / b["wall_s"] for a, b in zip(runs[mode], runs[RLMode.SYNC], strict=True)
            ),
            3,
        )

    calib_from = results.get(RLMode.COLOCATED) or next(iter(results.values()))
    calibration = {
        k: calib_from.get(k)
        for k in ("decode_tokens_per_s", "prefill_tokens_per_s", "train_tokens_per_s", "weight_sync_s")
    }
    args.calibration_out.write_text(json.dumps(calibration, indent=2) + "\n")
    print(f"calibration for benchmarks/async_sim.py --calibration: {args.calibration_out}")
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "task": "reply-with-word",
                "steps": args.steps,
                "batch_groups": args.batch_groups,
                "group_size": args.group_size,
                "max_tokens": args.max_tokens,
                "groups_trained": {str(m): s["groups_trained"] for m, s in results.items()},
                "reps": args.reps,
                "wall_s": {str(m): [round(s["wall_s"], 1) for s in rs] for m, rs in runs.items()},
                "train_s_mean": {str(m): [s["train_s"] for s in rs] for m, rs in runs.items()},
                "engine_idle_frac": {str(m): s["engine_idle_frac"] for m, s in results.items()},
                "staleness_mean": {str(m): s["staleness_mean"] for m, s in results.items()},
                "colocated_wall_ratio_vs_sync": ratio(RLMode.COLOCATED),
                "separate_wall_ratio_vs_sync": ratio(RLMode.SEPARATE),
                "heldout_reward_base": round(base, 4),
                "reward_gain_colocated": None if gain is None else round(gain, 4),
                "calibration": calibration,
                "load_avg_end": os.getloadavg(),
                "total_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
