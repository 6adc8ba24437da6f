"""The local engine's weight layouts side by side: the layout this host's probe picks per weight shape
(harnessrl/engine/layout.py) against one fixed layout for every matrix — `transposed` (the engine's fixed
choice before the probe) and `plain` — on the same batch decode, in one process.

One engine per layout (the tiny model, float32, `--threads`, prefix cache and speculative decoding off, so
only the products differ); rounds alternate between them, so that a shared machine's load drifts hit all
alike. Each round: `--batch` concurrent greedy requests over distinct prompts, once for 2 tokens and once for
`--max-tokens` + 2; the difference is decode time alone (prefill and the first token cancel out). Reported
per layout: decode tokens/s (median over rounds), and whether the greedy outputs are identical across
layouts (the products differ only in summation order).

    .venv/bin/python benchmarks/engine_layout.py [--threads 1] [--batch 8] [--max-tokens 64] [--rounds 5]

Last line: JSON with `probed_vs_transposed_decode_ratio`, `probed_vs_plain_decode_ratio` (above 1: the
probed layout decodes faster), the picks, the per-layout tokens/s, `identical_outputs`.
`--smoke`: 2 rounds of 2 requests x 4 tokens (figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from harnessrl.engine import layout
from harnessrl.engine.base import SamplingParams
from harnessrl.engine.local import LocalEngine
from harnessrl.progress import track

SUBJECTS = ["cat", "dog", "fox", "owl", "bee", "ant", "elk", "yak", "cow", "hen", "eel", "ram"]
GREEDY = SamplingParams(temperature=0.0)


def engine_with(fixed: str | None, threads: int) -> LocalEngine:
    """An engine whose every matrix is in layout `fixed`, or in the probe's pick per shape (None)."""
    if fixed:
        os.environ[layout.OVERRIDE_ENV] = fixed
    else:
        os.environ.pop(layout.OVERRIDE_ENV, None)
    try:
        return LocalEngine(threads=threads, speculative_tokens=0, prefix_cache_mb=0)
    finally:
        os.environ.pop(layout.OVERRIDE_ENV, None)


async def timed(engine: LocalEngine, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, GREEDY, tokens) for p in prompts))
    return time.perf_counter() - t0, [o.token_ids for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.max_tokens, args.rounds = 2, 4, 2
    engines = {name: engine_with(fixed, args.threads) for name, fixed in
               [("transposed", "transposed"), ("plain", "plain"), ("probed", None)]}  # fmt: skip
    probed = engines["probed"]
    picks = {
        name: str(module.layout)
        for name, module in probed.model.named_modules()
        if isinstance(module, layout.LayoutLinear)
        and (name.startswith("model.layers.0.") or name == "lm_head")
    }
    tokenizer = probed.tokenizer
    prompts = [
        list(
            tokenizer.encode(
                f"Write a long story about a {SUBJECTS[i % len(SUBJECTS)]} who travels far, {i}."
            )
        )
        for i in range(args.batch)
    ]
    rates: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {}
    plan = [(name, engine) for _ in range(args.rounds) for name, engine in engines.items()]
    for name, engine in track(plan, "layout rounds"):
        short, _ = asyncio.run(timed(engine, prompts, 2))
        full, outputs[name] = asyncio.run(timed(engine, prompts, args.max_tokens + 2))
        rates[name].append(args.batch * args.max_tokens / max(full - short, 1e-9))
    median = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in rates.items():
        print(
            f"{name}: decode tokens/s median {median[name]:.1f} (rounds: {', '.join(f'{x:.1f}' for x in v)})"
        )
    identical = sum(outputs["probed"] == outputs[n] for n in ("transposed", "plain"))
    result = {
        "probed_vs_transposed_decode_ratio": round(median["probed"] / median["transposed"], 4),
        "probed_vs_plain_decode_ratio": round(median["probed"] / median["plain"], 4),
        "decode_tokens_per_s": {name: round(v, 2) for name, v in median.items()},
        "picks_layer0_and_head": picks,
        "identical_outputs": f"{identical}/2",
        "threads": args.threads,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "load_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result), flush=True)
    os._exit(0)  # the engines' scheduler threads need no orderly shutdown here


if __name__ == "__main__":
    main()
