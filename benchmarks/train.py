"""Packed vs padded micro-batches: tokens/s and peak memory of one GRPO step on SmolLM2-135M (CPU).

The batch has a 10× length spread (16…160 tokens). Padded: 4 sequences per micro-batch, right-padded to the
longest. Packed: the same token budget per micro-batch (4 × 160), sequences concatenated with restarting
position ids, no padding. Each (mode, repetition) runs in a fresh child process so peak RSS is per mode;
modes alternate so machine load hits both alike.

    .venv/bin/python benchmarks/train.py [--reps 2] [--threads 0] [--smoke]

Last line: JSON with packed_speedup, padding_fraction_packed, padding_fraction_padded, peak_rss_mb.
`--smoke`: one repetition of each mode on sequences a quarter as long (4…40 tokens), 1 torch thread unless
`--threads`, seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time

LENGTHS = [16, 24, 40, 56, 80, 104, 136, 160]
SMOKE_LENGTHS = [n // 4 for n in LENGTHS]


def child(mode: str, threads: int, lengths: list[int]) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from harnessrl.tinymodel import load_model
    from harnessrl.train.batching import SeqItem
    from harnessrl.train.losses import sequence_weights
    from harnessrl.train.modes import LossMode
    from harnessrl.train.trainer import Trainer, TrainerConfig

    rng = random.Random(0)
    lengths = list(lengths)
    rng.shuffle(lengths)  # padded micro-batches mix short and long sequences, as real batches do
    seqs = []
    for i, n in enumerate(lengths):
        prompt = n // 4
        ids = [rng.randrange(100, 49000) for _ in range(n)]
        mask = [0] * prompt + [1] * (n - prompt)
        beh = [0.0] * prompt + [-rng.uniform(0.1, 3.0) for _ in range(n - prompt)]
        seqs.append((ids, mask, beh, f"r{i % 4}"))
    w = sequence_weights(
        [sum(m[1:]) for _, m, _, _ in seqs], [r for *_, r in seqs], LossMode.ROLLOUT_TOKEN_MEAN
    )
    items = [
        SeqItem(i, m, b, 1.0 if k % 2 else -1.0, wk, r)
        for k, ((i, m, b, r), wk) in enumerate(zip(seqs, w, strict=True))
    ]
    cfg = TrainerConfig(
        packing=(mode == "packed"), max_tokens_per_micro_batch=4 * max(lengths), seqs_per_micro_batch=4
    )
    trainer = Trainer(load_model(), cfg)
    t = time.perf_counter()
    m = trainer.step(items)
    elapsed = time.perf_counter() - t
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "mode": mode,
                "tokens": m["tokens"],
                "step_s": elapsed,
                "tokens_per_s": m["tokens"] / elapsed,
                "padding_fraction": m["padding_fraction"],
                "micro_batches": m["micro_batches"],
                "peak_rss_mb": rss_mb,
                "loss": m["loss"],
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="one repetition, sequences a quarter as long")
    ap.add_argument("--child", choices=["packed", "padded"], help=argparse.SUPPRESS)
    ap.add_argument("--lengths", help=argparse.SUPPRESS)  # the child's sequence lengths, comma-separated
    args = ap.parse_args()
    if args.child:
        child(args.child, args.threads, [int(n) for n in args.lengths.split(",")])
        return
    lengths = LENGTHS
    if args.smoke:
        args.reps, lengths = 1, SMOKE_LENGTHS
        args.threads = args.threads or 1  # one thread: a shared machine's other jobs cannot stall it
    results: dict[str, list[dict]] = {"packed": [], "padded": []}
    for rep in range(args.reps):
        for mode in ("padded", "packed") if rep % 2 == 0 else ("packed", "padded"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--threads",
                    str(args.threads),
                    "--lengths",
                    ",".join(map(str, lengths)),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode].append(row)
            print(
                f"rep {rep} {mode:6s}: {row['tokens_per_s']:.1f} tok/s, step {row['step_s']:.1f}s, "
                f"padding {row['padding_fraction']:.1%}, {row['micro_batches']} micro-batches, "
                f"peak RSS {row['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    tps = {m: statistics.median(r["tokens_per_s"] for r in rows) for m, rows in results.items()}
    rss = {m: max(r["peak_rss_mb"] for r in rows) for m, rows in results.items()}
    assert abs(results["packed"][0]["loss"] - results["padded"][0]["loss"]) < 1e-4, (
        "modes must compute the same loss"
    )
    print(
        json.dumps(
            {
                "packed_speedup": round(tps["packed"] / tps["padded"], 3),
                "tokens_per_s_packed": round(tps["packed"], 1),
                "tokens_per_s_padded": round(tps["padded"], 1),
                "padding_fraction_packed": results["packed"][0]["padding_fraction"],
                "padding_fraction_padded": round(results["padded"][0]["padding_fraction"], 4),
                "peak_rss_mb": round(rss["packed"], 1),
                "peak_rss_mb_padded": round(rss["padded"], 1),
                "reps": args.reps,
                "lengths": lengths,
            }
        )
    )


if __name__ == "__main__":
    main()
