"""Local engine speed on this machine, every comparison side by side in one run (one process, one thread
setting, one set of weights; absolute rates on a shared machine are noisy, the ratios are the figures):

  1. attainable FLOP/s: a matmul microbenchmark (model-shaped and square GEMMs, fp32 and bf16) at the
     engine's thread count — the limit the engine's prefill and decode FLOP/s are set against; and attainable
     memory bandwidth (a 256 MB copy and matrix-vector product) — the limit of a decode step, which reads
     every weight and every row's keys/values for a few tokens of arithmetic;
  2. multi-turn agentic workload (shared system prompt with tool definitions, growing history, N concurrent
     sessions, greedy) with the prefix cache off vs on: turn latency, identical outputs, hit rate, achieved
     prefill/decode FLOP/s; and cache on without speculative decoding (the engine's decode step before
     prompt-lookup drafts): turn latency, decode step ms, identical outputs;
  3. batched decoding: N single-turn sessions through the engine vs one-at-a-time `model.generate`
     (greedy outputs compared token by token);
  4. number formats: the same N single-turn sessions through a float32 and a bfloat16 engine (same weights,
     alternating): tokens/s and achieved FLOP/s over each format's attainable FLOP/s, identical greedy
     outputs, and the gap TIS corrects — the bfloat16 engine's logprobs of tokens it sampled at temperature 1
     against the float32 model's (what an fp32 trainer computes) and against the model under bf16 autocast
     (a bf16 trainer): mean and max |difference|, mean truncated importance weight min(exp(trainer − engine),
     2) and the share of tokens the cap truncates; and what `dtype: auto` picks here (`harnessrl.numformat`).

    .venv/bin/python benchmarks/engine.py [--sessions 8] [--turns 6] [--turn-tokens 32] [--threads 1]
        [--dtype float32] [--step-tokens 256] [--speculative-tokens 6] [--repeats 1] [--probe-s 1.0]
        [--skip-generate-baseline] [--skip-speculation-baseline] [--skip-formats] [--smoke]

`--smoke`: every part at its smallest (2 sessions x 2 turns x 8 tokens, 8 tokens per batched session, 0.1 s
per FLOP/s and bandwidth probe): checks that the script runs end to end in seconds; its figures mean nothing.

Last line: one JSON object with `prefix_cache_speedup` (mean turn latency off / on), `cache_hit_rate`,
`prefill_flops_fraction`, `decode_flops_fraction` (the cache-on run's achieved FLOP/s over the attainable
FLOP/s of the engine's dtype, the better of a measurement before and one after the workload),
`decode_bandwidth_fraction` (bytes decode steps had to read per second over the attainable bandwidth, the same
way), `decode_step_ms` and `decode_tokens_per_row_step` (tokens a decoding request emits per step),
`speculative_speedup` (mean turn latency cache on without / with speculative decoding), `batched_speedup`,
`bf16_vs_fp32_tokens_per_s` (part 4: the bfloat16 engine's tokens/s over the float32 one's),
`flops_fraction_float32` / `flops_fraction_bfloat16`, `identical_greedy_fp32_bf16`, `bf16_logprob_gap_fp32`
(mean |bf16 engine − fp32 model| per sampled token), `tis_weight_mean_fp32`, `auto_engine_dtype`,
`auto_engine_bf16_factor`, and the settings and load they were measured under.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from harnessrl.engine.base import DType
from harnessrl.logs import configure_logging
from harnessrl.progress import track

logger = logging.getLogger(__name__)


GEMM_SHAPES = [(512, 576, 1536), (512, 1536, 576), (1024, 1024, 1024), (2048, 2048, 2048)]


def _calls_per_s(run: Callable[[], object], seconds: float) -> float:
    """How often `run` completes per second, run repeatedly for `seconds` after one warm-up call."""
    run()
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run()
        reps += 1
    return reps / (time.perf_counter() - start)


def attainable_flops(dtype: torch.dtype, seconds: float = 1.0) -> tuple[float, tuple[int, int, int]]:
    """Best FLOP/s of `x @ W^T` over model-shaped and square GEMMs (each run for `seconds`)."""
    best, best_shape = 0.0, GEMM_SHAPES[0]
    with torch.inference_mode():
        for m, k, n in GEMM_SHAPES:
            a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
            rate = 2 * m * k * n * _calls_per_s(functools.partial(torch.nn.functional.linear, a, w), seconds)
            if rate > best:
                best, best_shape = rate, (m, k, n)
    return best, best_shape


def attainable_bandwidth(megabytes: int = 256, seconds: float = 1.0) -> float:
    """Best bytes/s of reading memory: a copy of a `megabytes` tensor (bytes read + written) and a
    matrix-vector product over a `megabytes` matrix (what a decode step does to each weight)."""
    count = megabytes * 2**20 // 4
    with torch.inference_mode():
        source, target = torch.ones(count), torch.empty(count)
        matrix, vector = torch.ones(count // 4096, 4096), torch.ones(4096)
        return max(
            2 * 4 * count * _calls_per_s(lambda: target.copy_(source), seconds),
            4 * count * _calls_per_s(lambda: matrix.mv(vector), seconds),
        )


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> float:
    return float(after[key]) - float(before[key])


def _figures(engine: Any) -> dict[str, Any]:
    """Every counter the local engine reports, as it stands now (`LocalEngine.snapshot().figures`)."""
    return dict(engine.snapshot().figures)


async def _agentic_run(engine: Any, workload: Any) -> dict[str, Any]:
    before = _figures(engine)
    start = time.perf_counter()
    traces = await workload.run(engine)
    wall = time.perf_counter() - start
    after = _figures(engine)
    hits = after["prefix_cache"]["hit_tokens"] - before["prefix_cache"]["hit_tokens"]
    looked = after["prefix_cache"]["lookup_tokens"] - before["prefix_cache"]["lookup_tokens"]
    prefill_s = _delta(after, before, "prefill_forward_s")
    decode_s = _delta(after, before, "decode_forward_s")
    return {
        "wall_s": wall,
        "turn_s": statistics.mean(x for t in traces for x in t.latencies),
        "outputs": [t.outputs for t in traces],
        "hit_rate": hits / looked if looked else 0.0,
        "prefill_flops_per_s": _delta(after, before, "prefill_flops") / prefill_s if prefill_s else 0.0,
        "decode_flops_per_s": _delta(after, before, "decode_flops") / decode_s if decode_s else 0.0,
        "decode_bytes_per_s": _delta(after, before, "decode_bytes") / decode_s if decode_s else 0.0,
        "prefill_forward_s": prefill_s,
        "decode_forward_s": decode_s,
        "prefill_tokens": _delta(after, before, "prefill_forward_tokens"),
        "decode_rows_per_step": _delta(after, before, "decode_row_tokens")
        / max(1.0, _delta(after, before, "decode_steps")),
        "decode_step_ms": 1000 * decode_s / max(1.0, _delta(after, before, "decode_forward_steps")),
        "decode_tokens_per_row_step": _delta(after, before, "decode_emitted_tokens")
        / max(1.0, _delta(after, before, "decode_row_tokens")),
        "prompt_tokens": sum(sum(t.prompts) for t in traces),
    }


def agentic(args: argparse.Namespace, on: Any, off: Any, plain: Any | None) -> dict[str, Any]:
    from tests.engine.agentic import AgenticWorkload

    workload = AgenticWorkload(on.tokenizer, args.sessions, args.turns, args.turn_tokens)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": [], "plain": []}
    for repeat in range(args.repeats):
        order = [("off", off), ("on", on)] if repeat % 2 == 0 else [("on", on), ("off", off)]
        if plain is not None:
            order.insert(1, ("plain", plain))  # between the two, so that load drifts hit both sides
        for name, engine in order:
            if name != "off":
                engine.prefix_cache.clear()  # every repeat starts cold: the system prompt is computed once
            result = asyncio.run(_agentic_run(engine, workload))
            runs[name].append(result)
            label = {"off": "cache off", "on": "cache on", "plain": "cache on, no speculation"}[name]
            print(
                f"agentic repeat {repeat + 1}, {label}: {result['wall_s']:.1f} s, mean turn "
                f"{result['turn_s']:.2f} s, prefill {result['prefill_tokens']:.0f} tokens in "
                f"{result['prefill_forward_s']:.1f} s ({result['prefill_flops_per_s'] / 1e9:.1f} GFLOP/s), "
                f"decode {result['decode_forward_s']:.1f} s ({result['decode_flops_per_s'] / 1e9:.1f} GFLOP/s, "
                f"{result['decode_rows_per_step']:.1f} rows/step, {result['decode_step_ms']:.0f} ms/step, "
                f"{result['decode_tokens_per_row_step']:.2f} tokens/row-step), hit rate {result['hit_rate']:.3f}",
                file=sys.stderr,
            )
    identical = [
        sum(a == b for a, b in zip(x["outputs"], y["outputs"], strict=True))
        for x, y in zip(runs["off"], runs["on"], strict=True)
    ]

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    baseline: dict[str, Any] = {}
    if runs["plain"]:
        same = [
            sum(a == b for a, b in zip(x["outputs"], y["outputs"], strict=True))
            for x, y in zip(runs["plain"], runs["on"], strict=True)
        ]
        baseline = {
            "speculative_speedup": med("plain", "turn_s") / med("on", "turn_s"),
            "turn_s_no_speculation": med("plain", "turn_s"),
            "decode_step_ms_no_speculation": med("plain", "decode_step_ms"),
            "identical_outputs_no_speculation": f"{min(same)}/{args.sessions}",
        }
    return {
        "prefix_cache_speedup": med("off", "turn_s") / med("on", "turn_s"),
        "turn_s_cache_off": med("off", "turn_s"),
        "turn_s_cache_on": med("on", "turn_s"),
        "wall_s_cache_off": med("off", "wall_s"),
        "wall_s_cache_on": med("on", "wall_s"),
        "cache_hit_rate": med("on", "hit_rate"),
        "identical_agentic_outputs": f"{min(identical)}/{args.sessions}",
        "prefill_flops_per_s": med("on", "prefill_flops_per_s"),
        "prefill_flops_per_s_cache_off": med("off", "prefill_flops_per_s"),
        "decode_flops_per_s": med("on", "decode_flops_per_s"),
        "decode_bytes_per_s": med("on", "decode_bytes_per_s"),
        "decode_step_ms": med("on", "decode_step_ms"),
        "decode_tokens_per_row_step": med("on", "decode_tokens_per_row_step"),
        **baseline,
        "prompt_tokens_per_run": runs["on"][0]["prompt_tokens"],
    }


def batched(args: argparse.Namespace, engine: Any) -> dict[str, Any]:
    """N single-turn sessions through the engine vs one-at-a-time `model.generate` (same weights)."""
    from harnessrl.engine.base import SamplingParams
    from harnessrl.tinymodel import load_model

    tokenizer = engine.tokenizer
    # Any: transformers types `generate`'s self as a protocol its own model classes do not satisfy
    baseline_model: Any = load_model(engine.model_dir, dtype=args.dtype).eval()
    prompts = _prompts(tokenizer, args.sessions)
    stop = sorted(engine.default_stop)
    # the engine's tokenizer is the light one (no `pad_token_id`); with one prompt per call `generate` never
    # pads, but it wants an id: the tokenizer's end-of-sequence token, as transformers itself falls back to
    pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else stop[0]
    greedy = SamplingParams(temperature=0.0)

    def run_baseline() -> tuple[float, list[list[int]]]:
        outputs = []
        start = time.perf_counter()
        with torch.inference_mode():
            for prompt in track(prompts, "model.generate one at a time"):
                ids = torch.tensor([prompt])
                out = baseline_model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=args.max_tokens,
                    eos_token_id=stop,
                    pad_token_id=pad_id,
                )
                outputs.append(out[0, len(prompt) :].tolist())
        return time.perf_counter() - start, outputs

    async def run_engine() -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        gens = await asyncio.gather(*(engine.generate(p, greedy, args.max_tokens) for p in prompts))
        return time.perf_counter() - start, [g.token_ids for g in gens]

    base_s, base_out = run_baseline()
    engine_s, engine_out = asyncio.run(run_engine())
    base_rate = sum(len(o) for o in base_out) / base_s
    engine_rate = sum(len(o) for o in engine_out) / engine_s
    same = sum(a == b for a, b in zip(base_out, engine_out, strict=True))
    print(
        f"batched: generate {base_rate:.1f} tok/s, engine {engine_rate:.1f} tok/s "
        f"({engine_rate / base_rate:.2f}x); identical outputs {same}/{len(prompts)}",
        file=sys.stderr,
    )
    return {
        "batched_speedup": engine_rate / base_rate,
        "engine_tokens_per_s": engine_rate,
        "generate_tokens_per_s": base_rate,
        "identical_greedy_outputs": f"{same}/{len(prompts)}",
    }


def formats(args: argparse.Namespace, fp32: Any, peaks: dict[str, tuple[float, Any]]) -> dict[str, Any]:
    """Part 4: the batched sessions through a float32 and a bfloat16 engine, and the logprob gap TIS corrects."""
    from harnessrl import numformat
    from harnessrl.engine.base import SamplingParams
    from harnessrl.engine.local import LocalEngine
    from harnessrl.tinymodel import load_model

    bf16 = LocalEngine(max_batch=args.sessions, threads=args.threads, dtype=DType.BFLOAT16)
    engines = {"float32": fp32, "bfloat16": bf16}
    prompts = _prompts(fp32.tokenizer, args.sessions)
    greedy = SamplingParams(temperature=0.0)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {}

    async def batch(engine: Any, sampling: list[SamplingParams]) -> tuple[float, list[Any]]:
        start = time.perf_counter()
        gens = await asyncio.gather(
            *(engine.generate(p, s, args.max_tokens) for p, s in zip(prompts, sampling, strict=True))
        )
        return time.perf_counter() - start, gens

    for repeat in range(args.repeats):
        for name in list(engines) if repeat % 2 == 0 else list(reversed(engines)):
            engine = engines[name]
            engine.prefix_cache.clear()
            before = _figures(engine)
            wall, gens = asyncio.run(batch(engine, [greedy] * len(prompts)))
            after = _figures(engine)
            seconds = _delta(after, before, "prefill_forward_s") + _delta(after, before, "decode_forward_s")
            flops = _delta(after, before, "prefill_flops") + _delta(after, before, "decode_flops")
            rate = sum(len(g.token_ids) for g in gens) / wall
            runs[name].append({"tokens_per_s": rate, "flops_per_s": flops / seconds if seconds else 0.0})
            outputs[name] = [g.token_ids for g in gens]
            print(f"formats repeat {repeat + 1}, {name}: {rate:.1f} tokens/s", file=sys.stderr)
    same = sum(a == b for a, b in zip(outputs["float32"], outputs["bfloat16"], strict=True))
    # the gap TIS corrects: tokens the bf16 engine samples (T=1) scored by the trainer's model in each format
    sampled = [SamplingParams(temperature=1.0, seed=1000 + i) for i in range(len(prompts))]
    _, gens = asyncio.run(batch(bf16, sampled))
    bf16.close()
    model: Any = load_model(fp32.model_dir).eval()
    gaps: dict[str, list[float]] = {"fp32": [], "bf16": []}
    with torch.inference_mode():
        for prompt, gen in zip(prompts, gens, strict=True):
            ids = torch.tensor([prompt + gen.token_ids])
            for trainer, autocast in (("fp32", False), ("bf16", True)):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
                scored = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
                gaps[trainer] += (scored - torch.tensor(gen.logprobs)).tolist()
    probe = numformat.probe("engine")
    out: dict[str, Any] = {}
    for trainer, gap in gaps.items():
        weights = [min(math.exp(g), 2.0) for g in gap]  # TIS: min(pi_old / pi_behavior, tis_cap 2)
        out |= {
            f"bf16_logprob_gap_{trainer}": statistics.mean(abs(g) for g in gap),
            f"bf16_logprob_gap_max_{trainer}": max(abs(g) for g in gap),
            f"tis_weight_mean_{trainer}": statistics.mean(weights),
            f"tis_capped_share_{trainer}": sum(w >= 2.0 for w in weights) / len(weights),
        }
    rates = {name: statistics.median(r["tokens_per_s"] for r in rows) for name, rows in runs.items()}
    return {
        "bf16_vs_fp32_tokens_per_s": rates["bfloat16"] / rates["float32"],
        "tokens_per_s_float32": rates["float32"],
        "tokens_per_s_bfloat16": rates["bfloat16"],
        **{
            f"flops_fraction_{name}": statistics.median(r["flops_per_s"] for r in rows) / peaks[name][0]
            for name, rows in runs.items()
        },
        "identical_greedy_fp32_bf16": f"{same}/{len(prompts)}",
        **out,
        "gap_tokens": sum(len(g.token_ids) for g in gens),
        "auto_engine_dtype": probe.pick,
        "auto_engine_bf16_factor": probe.factor,
    }


def _prompts(tokenizer: Any, sessions: int) -> list[list[int]]:
    from tests.engine.agentic import QUESTIONS

    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in (QUESTIONS * (1 + sessions // len(QUESTIONS)))[:sessions]
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6, help="agentic turns per session")
    parser.add_argument("--turn-tokens", type=int, default=32, help="max tokens per agentic turn")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per session in the batched part")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads, fixed for the whole run so that FLOP/s compare with the matmul at the same count",
    )
    parser.add_argument("--dtype", type=DType, default=DType.FLOAT32, choices=list(DType))
    parser.add_argument("--step-tokens", type=int, default=None, help="engine step token budget")
    parser.add_argument(
        "--speculative-tokens", type=int, default=None, help="prompt-lookup drafts per row (0: off)"
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--skip-speculation-baseline", action="store_true", help="leave out the cache-on run without drafts"
    )
    parser.add_argument("--skip-generate-baseline", action="store_true", help="leave out part 3")
    parser.add_argument("--skip-formats", action="store_true", help="leave out part 4 (float32 vs bfloat16)")
    parser.add_argument(
        "--probe-s", type=float, default=1.0, help="seconds each matmul shape and bandwidth probe runs"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every part at its smallest (seconds; the figures mean nothing): 2 sessions x 2 turns x 8 tokens",
    )
    args = parser.parse_args()
    configure_logging()
    if args.smoke:
        args.sessions, args.turns, args.turn_tokens, args.max_tokens = 2, 2, 8, 8
        args.repeats, args.probe_s = 1, 0.1
        logger.info("smoke run: the figures only show that every part runs")

    from harnessrl.engine.local import LocalEngine

    options: dict[str, Any] = {"max_batch": args.sessions, "threads": args.threads, "dtype": args.dtype}
    if args.step_tokens:
        options["step_tokens"] = args.step_tokens
    if args.speculative_tokens is not None:
        options["speculative_tokens"] = args.speculative_tokens
    on = LocalEngine(**options)
    off = LocalEngine(**options, prefix_cache_mb=0)
    plain = None
    if not args.skip_speculation_baseline:
        plain = LocalEngine(**{**options, "speculative_tokens": 0})
    threads = torch.get_num_threads()
    load_before = os.getloadavg()[0]
    print(
        f"{args.sessions} sessions x {args.turns} turns x {args.turn_tokens} tokens, torch threads {threads}, "
        f"{args.dtype}, step tokens {on.step_tokens}, speculative tokens {on.speculative_tokens}, "
        f"load {load_before:.2f}",
        file=sys.stderr,
    )
    peaks = {name: attainable_flops(getattr(torch, name), args.probe_s) for name in ("float32", "bfloat16")}
    for name, (rate, shape) in peaks.items():
        print(f"matmul {name}: {rate / 1e9:.1f} GFLOP/s (best shape {shape})", file=sys.stderr)
    bandwidth = attainable_bandwidth(seconds=args.probe_s)
    print(f"memory: {bandwidth / 1e9:.1f} GB/s", file=sys.stderr)
    result: dict[str, Any] = agentic(args, on, off, plain)
    off.close()
    if plain is not None:
        plain.close()
    # again after the workload: on a shared machine the load moves; the better of the two is the limit
    for name, (rate, shape) in list(peaks.items()):
        again = attainable_flops(getattr(torch, name), args.probe_s)
        print(f"matmul {name} after the workload: {again[0] / 1e9:.1f} GFLOP/s", file=sys.stderr)
        peaks[name] = max((rate, shape), again)
    bandwidth = max(bandwidth, attainable_bandwidth(seconds=args.probe_s))
    limit = peaks[str(args.dtype)][0] if str(args.dtype) in peaks else peaks["float32"][0]
    if not args.skip_generate_baseline:
        result.update(batched(args, on))
    if not args.skip_formats and args.dtype == DType.FLOAT32:
        result.update(formats(args, on, peaks))
    on.close()
    result.update(
        prefill_flops_fraction=result["prefill_flops_per_s"] / limit,
        decode_flops_fraction=result["decode_flops_per_s"] / limit,
        decode_bandwidth_fraction=result["decode_bytes_per_s"] / bandwidth,
        attainable_gbytes_per_s=round(bandwidth / 1e9, 1),
        attainable_gflops_per_s={name: round(rate / 1e9, 1) for name, (rate, _) in peaks.items()},
        sessions=args.sessions,
        turns=args.turns,
        turn_tokens=args.turn_tokens,
        torch_threads=threads,
        dtype=str(args.dtype),
        step_tokens=on.step_tokens,
        speculative_tokens=on.speculative_tokens,
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
