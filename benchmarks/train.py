"""Packed vs padded micro-batches, and fp32 vs bf16 compute: tokens/s and peak memory of one GRPO step on
SmolLM2-135M (CPU).

The batch has a 10× length spread (16…160 tokens). Padded: 4 sequences per micro-batch, right-padded to the
longest. Packed: the same token budget per micro-batch (4 × 160), sequences concatenated with restarting
position ids, no padding. Both in fp32; packed once more under bf16 autocast (`precision: bf16`: fp32 master
weights and AdamW state). Each (mode, repetition) runs in a fresh child process so peak RSS is per mode; modes
alternate so machine load hits them alike. The matmul limit of each format is `harnessrl.numformat`'s trainer
probe (forward and backward products at the model's shapes, measured here at the same thread count, the better
of a measurement before and one after the steps), and a
step's FLOPs are 6 × the linear and head weights × its tokens (attention's few left out).

    .venv/bin/python benchmarks/train.py [--reps 2] [--threads 0] [--row-tokens 0] [--copies 1] [--smoke]

Packed once more with transformers' row-wide block-diagonal mask instead of per-sequence attention (the
trainer's own, train/segments.py): `per_sequence_attention_speedup`. And a CLI agent's step: 2 groups × 4
replies (16…128 tokens) under Codex's first prompt as measured in an RL run (1,376 tokens every rollout shares,
58 of the group's task), at the trainer's default budget (1,024 tokens), packed whole vs with the shared prefix
packed once (`share_prefixes`, train/batching.py): `shared_prefix_step_speedup`, `shared_prefix_token_ratio`
(tokens computed, shared over whole), the same loss. `--row-tokens N` sets the packed budget
(the trainer's default is 1,024; 0 here: four of the longest sequence) and `--copies K` repeats the batch K times.

Last line: JSON with packed_speedup, per_sequence_attention_speedup, shared_prefix_step_speedup,
shared_prefix_token_ratio, cli_step_s, padding_fraction_packed, padding_fraction_padded, peak_rss_mb,
`bf16_vs_fp32_tokens_per_s` (packed bf16 over packed fp32), `tokens_per_s_fp32` / `_bf16`, `matmul_fraction_fp32` /
`_bf16` (the step's FLOP/s over the probe's for its format), `matmul_limit_gflops`, and `auto_precision` with the
probe's `auto_bf16_factor` (what `precision: auto` picks on this host, from the cached probe).
`--smoke`: one repetition of each mode on sequences an eighth as long (2…20 tokens; the CLI step's a 32nd),
1 torch thread unless `--threads`, the matmul limits measured once (before the steps): ~3 minutes on a 2-core
AMD EPYC.
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
SMOKE_LENGTHS = [n // 8 for n in LENGTHS]
CLI_SHARED, CLI_TASK = 1376, 58  # Codex's first prompt: what every rollout shares, what its group's task adds
CLI_REPLIES = [16, 40, 64, 88, 104, 112, 120, 128]  # two groups of four
CLI_GROUP = 4
CLI_BUDGET = 1024  # the trainer's default max_tokens_per_micro_batch
SMOKE_CLI_SCALE = 32  # --smoke: the CLI step's sizes divided by this (a 43-token shared prompt)


RUNS = [
    ("padded", "fp32"),
    ("packed", "fp32"),
    ("packed", "bf16"),
    ("packed-row-mask", "fp32"),
    ("cli-whole", "fp32"),
    ("cli-shared", "fp32"),
]


# token ids, loss mask, behaviour logprobs, rollout id
RawSequence = tuple[list[int], list[int], list[float], str]


def cli_sequences(scale: int, rng: random.Random) -> list[RawSequence]:
    """A CLI agent's step: each reply after the shared prompt and its group's task (sizes divided by scale)."""
    shared = [rng.randrange(100, 49000) for _ in range(CLI_SHARED // scale)]
    groups = range(len(CLI_REPLIES) // CLI_GROUP)
    tasks = [[rng.randrange(100, 49000) for _ in range(CLI_TASK // scale)] for _ in groups]
    seqs = []
    for i, n in enumerate(CLI_REPLIES):
        prompt = shared + tasks[i // CLI_GROUP]
        reply = [rng.randrange(100, 49000) for _ in range(max(n // scale, 2))]
        beh = [0.0] * len(prompt) + [-rng.uniform(0.1, 3.0) for _ in reply]
        seqs.append((prompt + reply, [0] * len(prompt) + [1] * len(reply), beh, f"r{i}"))
    return seqs


def random_sequences(lengths: list[int], rng: random.Random) -> list[RawSequence]:
    """One sequence per length in shuffled order (padded micro-batches mix short and long sequences, as real
    batches do), its first quarter the untrained prompt."""
    shuffled = list(lengths)
    rng.shuffle(shuffled)
    seqs = []
    for i, n in enumerate(shuffled):
        prompt = n // 4
        ids = [rng.randrange(100, 49000) for _ in range(n)]
        beh = [0.0] * prompt + [-rng.uniform(0.1, 3.0) for _ in range(n - prompt)]
        seqs.append((ids, [0] * prompt + [1] * (n - prompt), beh, f"r{i % 4}"))
    return seqs


def child(
    mode: str,
    threads: int,
    lengths: list[int],
    precision: str = "fp32",
    row_tokens: int = 0,
    cli_scale: int = 1,
) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from harnessrl.tinymodel import load_model
    from harnessrl.train.batching import SeqItem
    from harnessrl.train.losses import sequence_weights
    from harnessrl.train.modes import LossMode
    from harnessrl.train.trainer import Trainer, TrainerConfig

    rng = random.Random(0)
    cli = mode.startswith("cli-")
    seqs = cli_sequences(cli_scale, rng) if cli else random_sequences(lengths, rng)
    w = sequence_weights(
        [sum(m[1:]) for _, m, _, _ in seqs], [r for *_, r in seqs], LossMode.ROLLOUT_TOKEN_MEAN
    )
    items = [
        SeqItem(i, m, b, 1.0 if k % 2 else -1.0, wk, r)
        for k, ((i, m, b, r), wk) in enumerate(zip(seqs, w, strict=True))
    ]
    cfg = TrainerConfig(
        packing=mode != "padded",
        max_tokens_per_micro_batch=CLI_BUDGET if cli else row_tokens or 4 * max(lengths),
        share_prefixes=mode == "cli-shared",
        seqs_per_micro_batch=4,
        precision=precision,  # pyright: ignore[reportArgumentType]  (parsed into a Precision)
    )
    model = load_model()
    trainer = Trainer(model, cfg)
    if mode == "packed-row-mask":  # the baseline: transformers' SDPA under a block-diagonal row-wide mask
        trainer._per_sequence.clear()
        model.config._attn_implementation = "sdpa"
    t = time.perf_counter()
    m = trainer.step(items)
    elapsed = time.perf_counter() - t
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "mode": mode,
                "precision": precision,
                "tokens": m["tokens"],
                "computed_tokens": m["computed_tokens"],
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
    ap.add_argument("--smoke", action="store_true", help="one repetition, sequences an eighth as long")
    ap.add_argument(
        "--row-tokens",
        type=int,
        default=0,
        help="packed micro-batch budget (default 4 x the longest sequence)",
    )
    ap.add_argument("--copies", type=int, default=1, help="the batch's sequences this many times over")
    ap.add_argument("--child", choices=sorted({mode for mode, _ in RUNS}), help=argparse.SUPPRESS)
    ap.add_argument("--lengths", help=argparse.SUPPRESS)  # the child's sequence lengths, comma-separated
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--cli-scale", type=int, default=1, help=argparse.SUPPRESS)  # the child's
    args = ap.parse_args()
    if args.child:
        child(
            args.child,
            args.threads,
            [int(n) for n in args.lengths.split(",")],
            args.precision,
            args.row_tokens,
            args.cli_scale,
        )
        return
    lengths = LENGTHS * args.copies
    if args.smoke:
        args.reps, lengths = 1, SMOKE_LENGTHS * args.copies
        args.threads = args.threads or 1  # one thread: a shared machine's other jobs cannot stall it
    limits = matmul_limits(args.threads, 0.05 if args.smoke else 0.5)
    results: dict[str, list[dict]] = {f"{mode}-{precision}": [] for mode, precision in RUNS}
    for rep in range(args.reps):
        for mode, precision in RUNS if rep % 2 == 0 else RUNS[::-1]:
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
                    "--precision",
                    precision,
                    "--row-tokens",
                    str(args.row_tokens),
                    "--cli-scale",
                    str(SMOKE_CLI_SCALE if args.smoke else 1),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[f"{mode}-{precision}"].append(row)
            print(
                f"rep {rep} {mode:15s} {precision}: {row['tokens_per_s']:.1f} tok/s, step {row['step_s']:.1f}s, "
                f"padding {row['padding_fraction']:.1%}, {row['micro_batches']} micro-batches, "
                f"peak RSS {row['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    if not args.smoke:  # the better of before and after
        after = matmul_limits(args.threads, 0.5)
        limits = {k: max(v, after[k]) for k, v in limits.items()}
    tps = {m: statistics.median(r["tokens_per_s"] for r in rows) for m, rows in results.items()}
    rss = {m: max(r["peak_rss_mb"] for r in rows) for m, rows in results.items()}
    packed, padded, bf16, row_mask = (
        results[k][0] for k in ("packed-fp32", "padded-fp32", "packed-bf16", "packed-row-mask-fp32")
    )
    for other in (padded, row_mask):
        assert abs(packed["loss"] - other["loss"]) < 1e-4, "modes must compute the same loss"
    cli_whole, cli_shared = results["cli-whole-fp32"][0], results["cli-shared-fp32"][0]
    assert abs(cli_whole["loss"] - cli_shared["loss"]) < 1e-4, "a shared prefix must leave the loss as it is"
    step_s = {m: statistics.median(r["step_s"] for r in rows) for m, rows in results.items()}
    flops_per_token = 6 * model_weights()  # forward and backward through every linear map and the head
    from harnessrl import numformat

    auto = numformat.probe("trainer")  # what `precision: auto` reads (measured once per host, cached)
    print(
        json.dumps(
            {
                "packed_speedup": round(tps["packed-fp32"] / tps["padded-fp32"], 3),
                "tokens_per_s_packed": round(tps["packed-fp32"], 1),
                "tokens_per_s_padded": round(tps["padded-fp32"], 1),
                "per_sequence_attention_speedup": round(tps["packed-fp32"] / tps["packed-row-mask-fp32"], 3),
                "shared_prefix_step_speedup": round(step_s["cli-whole-fp32"] / step_s["cli-shared-fp32"], 3),
                "shared_prefix_token_ratio": round(
                    cli_shared["computed_tokens"] / cli_whole["computed_tokens"], 4
                ),
                "cli_step_s": {
                    "whole": round(step_s["cli-whole-fp32"], 2),
                    "shared": round(step_s["cli-shared-fp32"], 2),
                },
                "tokens_per_s_packed_row_mask": round(tps["packed-row-mask-fp32"], 1),
                "micro_batches_packed": packed["micro_batches"],
                "padding_fraction_packed": packed["padding_fraction"],
                "padding_fraction_padded": round(padded["padding_fraction"], 4),
                "peak_rss_mb": round(rss["packed-fp32"], 1),
                "peak_rss_mb_padded": round(rss["padded-fp32"], 1),
                "bf16_vs_fp32_tokens_per_s": round(tps["packed-bf16"] / tps["packed-fp32"], 3),
                "tokens_per_s_fp32": round(tps["packed-fp32"], 1),
                "tokens_per_s_bf16": round(tps["packed-bf16"], 1),
                "matmul_fraction_fp32": round(tps["packed-fp32"] * flops_per_token / limits["fp32"], 3),
                "matmul_fraction_bf16": round(tps["packed-bf16"] * flops_per_token / limits["bf16"], 3),
                "matmul_limit_gflops": {k: round(v / 1e9, 1) for k, v in limits.items()},
                "loss_bf16_minus_fp32": round(bf16["loss"] - packed["loss"], 6),
                "peak_rss_mb_bf16": round(rss["packed-bf16"], 1),
                "auto_precision": "bf16" if auto.pick == numformat.BFLOAT16 else "fp32",
                "auto_bf16_factor": round(auto.factor, 3),
                "reps": args.reps,
                "threads": args.threads,
                "lengths": lengths,
                "row_tokens": args.row_tokens or 4 * max(lengths),
            }
        )
    )


def model_weights() -> int:
    """Weights of the tiny model's linear maps and its head (what a token's products multiply)."""
    from harnessrl.numformat import Shapes

    shapes = Shapes()
    return sum(k * n * times for k, n, times in shapes.linear())


def matmul_limits(threads: int, seconds: float) -> dict[str, float]:
    """FLOP/s of the trainer's products (forward and backward at the model's shapes) in fp32 and under bf16
    autocast, measured now at the children's thread count (`harnessrl.numformat.measure`)."""
    import torch

    from harnessrl import numformat

    torch.set_num_threads(threads or torch.get_num_threads())
    probe = numformat.measure("trainer", numformat.Shapes(), seconds=seconds)
    return {"fp32": probe.gflops(numformat.FLOAT32) * 1e9, "bf16": probe.gflops(numformat.BFLOAT16) * 1e9}


if __name__ == "__main__":
    main()
