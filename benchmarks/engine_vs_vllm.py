"""The local engine against vLLM CPU, side by side in one run: the same workloads, through the same HTTP client
(`HTTPEngine`), on the same model (the tiny SmolLM2-135M-Instruct, float32) and the same number of threads.

Both servers are started once and stay up for the whole run (an idle vLLM uses no CPU: measured); the parts
alternate between them, so a shared machine's load drifts hit both alike:

  - `harnessrl engine serve --threads N` (the local engine: its prefix cache, chunked prefill and prompt-lookup
    drafts, defaults otherwise) in a child process;
  - vLLM 0.32 CPU (`harnessrl.engine.vllm_server.VLLMServer`: float32, `--enforce-eager`, its prefix cache on,
    `VLLM_CPU_OMP_THREADS_BIND` = N cores, so its worker runs N OpenMP threads pinned to them).

Workloads (greedy, so both must produce the same tokens; each run starts with a flushed prefix cache):

  1. agentic multi-turn (`tests/engine/agentic.py`): N sessions x T turns, a shared ~470-token system prompt
     with tool definitions, each turn appends the reply and a tool result; mean seconds per turn (the model's
     time: no tool runs), the prompt tokens served from each engine's prefix cache, identical outputs;
  2. single-turn batch: B concurrent requests (the shared system prompt + one question each), M new tokens,
     streamed: output tokens/s end to end and decode tokens/s (tokens after each request's first, over the
     span from the first first-token to the last token).

Greedy outputs are compared token by token; where they agree, the logprobs are compared too (max and mean
absolute difference).

    .venv/bin/python benchmarks/engine_vs_vllm.py [--threads 1] [--sessions 8] [--turns 6] [--turn-tokens 32]
        [--batch 8] [--max-tokens 64] [--repeats 2] [--kv-cache-gib 2] [--smoke]

`--smoke`: 2 sessions x 2 turns x 8 tokens, a batch of 2 x 8 tokens, one repeat (seconds plus vLLM's start);
its figures mean nothing. Without vLLM (no `make vllm`, or it fails to start) the local engine still runs and
the vLLM figures are null, with `vllm_unavailable` saying why.

Last line: one JSON object with `local_vs_vllm_decode_tokens_per_s_ratio` (local decode tokens/s over vLLM's
in the batch: > 1 means the local engine decodes faster), `local_vs_vllm_turn_time_ratio` (local mean agentic
turn seconds over vLLM's: < 1 means the local engine is faster), the figures behind them per engine, hit rates,
`identical_agentic_outputs`, `identical_batch_outputs`, `max_logprob_diff`, start seconds, settings and load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.engine.base import Generation, SamplingParams
from harnessrl.logs import configure_logging

logger = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)
LOCAL, VLLM = "local", "vllm"


class LocalServer:
    """`harnessrl engine serve` in a child process (its own process, as vLLM runs in its own)."""

    def __init__(self, threads: int, max_batch: int) -> None:
        self.command = [
            sys.executable,
            "-m",
            "harnessrl.cli",
            "engine",
            "serve",
            "--port",
            "0",
            "--threads",
            str(threads),
            "--max-batch",
            str(max_batch),
        ]
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.start_s = 0.0

    def start(self) -> str:
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if "listening on" in line:
                self.url = line.split("listening on", 1)[1].split()[0]
                break
        if not self.url:
            raise RuntimeError(f"harnessrl engine serve exited ({self.process.wait()}) before listening")
        self.start_s = time.monotonic() - started
        return self.url

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Recorded:
    """Every generation of one run, per session in turn order (agentic) or per request (batch)."""

    sessions: dict[int, list[Generation]] = field(default_factory=dict)


def agentic_workload(tokenizer: Any, sessions: int, turns: int, max_tokens: int, record: Recorded) -> Any:
    from tests.engine.agentic import AgenticWorkload

    class RecordingWorkload(AgenticWorkload):
        async def generate(
            self, engine: Any, session: int, prompt: list[int], sampling: SamplingParams
        ) -> Generation:
            gen = await engine.generate(prompt, sampling, self.max_tokens)
            record.sessions.setdefault(session, []).append(gen)
            return gen

    return RecordingWorkload(tokenizer, sessions, turns, max_tokens)


async def flush_prefix_cache(engine: Any, name: str, model_dir: Path) -> None:
    """vLLM: its dev endpoint; ours: a weight sync to the same weights (it flushes the cache)."""
    if name == VLLM:
        await engine._call("POST", "/reset_prefix_cache")
    else:
        await engine._call("POST", "/load_weights", {"path": str(model_dir), "version": 0})


async def run_agentic(
    engine: Any, name: str, args: argparse.Namespace, tokenizer: Any, model_dir: Path
) -> dict:
    await flush_prefix_cache(engine, name, model_dir)
    record = Recorded()
    workload = agentic_workload(tokenizer, args.sessions, args.turns, args.turn_tokens, record)
    start = time.perf_counter()
    traces = await workload.run(engine, GREEDY)
    wall = time.perf_counter() - start
    prompt_tokens = sum(sum(t.prompts) for t in traces)
    cached = sum(sum(t.cached) for t in traces)
    return {
        "wall_s": wall,
        "turn_s": statistics.mean(x for t in traces for x in t.latencies),
        "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
        "prompt_tokens": prompt_tokens,
        "output_tokens": sum(len(o) for t in traces for o in t.outputs),
        "generations": [record.sessions[s] for s in range(args.sessions)],
    }


def batch_prompts(tokenizer: Any, batch: int) -> list[list[int]]:
    from tests.engine.agentic import QUESTIONS, SYSTEM

    return [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in (QUESTIONS * (1 + batch // len(QUESTIONS)))[:batch]
    ]


async def run_batch(
    engine: Any, name: str, args: argparse.Namespace, prompts: list[list[int]], model_dir: Path
) -> dict:
    """Every prompt at once, streamed: when each request's first and last token arrived."""
    await flush_prefix_cache(engine, name, model_dir)

    async def one(prompt: list[int]) -> tuple[Generation, float, float]:
        ids: list[int] = []
        logprobs: list[float] = []
        first = last = 0.0
        finish = None
        async for delta in engine.generate_stream(prompt, GREEDY, args.max_tokens):
            now = time.perf_counter()
            if delta.token_ids and not ids:
                first = now
            if delta.token_ids:
                last = now
            ids += delta.token_ids
            logprobs += delta.logprobs
            finish = delta.finish_reason or finish
        assert finish is not None
        return Generation(ids, logprobs, finish), first, last

    start = time.perf_counter()
    done = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g, _, _ in done)
    after_first = sum(max(0, len(g.token_ids) - 1) for g, _, _ in done)
    span = max(last for _, _, last in done) - min(first for _, first, _ in done)
    return {
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "decode_tokens_per_s": after_first / span if span > 0 else 0.0,
        "first_token_s": statistics.mean(first - start for _, first, _ in done),
        "output_tokens": tokens,
        "generations": [g for g, _, _ in done],
    }


def compare(a: list[Generation], b: list[Generation]) -> tuple[int, list[float]]:
    """Equal token lists, and the absolute logprob differences over each pair's common prefix of tokens."""
    same, diffs = 0, []
    for x, y in zip(a, b, strict=True):
        same += x.token_ids == y.token_ids
        for tx, ty, lx, ly in zip(x.token_ids, y.token_ids, x.logprobs, y.logprobs, strict=False):
            if tx != ty:
                break
            diffs.append(abs(lx - ly))
    return same, diffs


def compare_sessions(a: list[list[Generation]], b: list[list[Generation]]) -> tuple[int, list[float]]:
    """Sessions whose every turn is equal; logprob differences over the turns up to the first that differs
    (after it the prompts differ)."""
    same, diffs = 0, []
    for x, y in zip(a, b, strict=True):
        equal = True
        for gx, gy in zip(x, y, strict=True):
            _, d = compare([gx], [gy])
            diffs += d
            if gx.token_ids != gy.token_ids:
                equal = False
                break
        same += equal
    return same, diffs


def start_vllm(args: argparse.Namespace, model_dir: Path) -> tuple[Any, str | None]:
    """(the running server, None) or (None, why not)."""
    from harnessrl.engine.vllm_server import VLLMConfig, VLLMServer, VLLMStartError, vllm_unavailable

    reason = vllm_unavailable()
    if reason is not None:
        return None, reason
    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    server = VLLMServer(VLLMConfig(model_dir, kv_cache_gib=args.kv_cache_gib, env=env))
    try:
        server.start()
    except (VLLMStartError, OSError) as e:  # OSError: HARNESSRL_VLLM_PYTHON names no interpreter
        return None, f"vLLM did not start: {' '.join(str(e).split())[:500]}"
    return server, None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of each engine (vLLM: cores bound)"
    )
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--turn-tokens", type=int, default=32, help="max tokens per agentic turn")
    parser.add_argument("--batch", type=int, default=8, help="concurrent single-turn requests")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per single-turn request")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each part per engine (alternating)")
    parser.add_argument("--kv-cache-gib", type=int, default=2, help="vLLM's CPU KV cache (whole GiB)")
    parser.add_argument(
        "--vllm-url",
        default=None,
        help="an already running vLLM of the same model (not started or stopped here)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="every part at its smallest (figures mean nothing)"
    )
    args = parser.parse_args()
    configure_logging()
    if args.smoke:
        args.sessions, args.turns, args.turn_tokens, args.batch, args.max_tokens, args.repeats = (
            2,
            2,
            8,
            2,
            8,
            1,
        )
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.light_tokenizer import LightTokenizer
    from harnessrl.tinymodel import tiny_model_dir

    model_dir = tiny_model_dir()
    tokenizer = LightTokenizer(model_dir)
    load_before = os.getloadavg()[0]
    prompts = batch_prompts(tokenizer, args.batch)
    local = LocalServer(args.threads, max(args.sessions, args.batch))
    vllm: Any = None
    runs: dict[str, dict[str, list[dict]]] = {}

    async def measure(urls: dict[str, str]) -> None:
        engines = {name: HTTPEngine(url) for name, url in urls.items()}
        try:
            for engine in engines.values():  # the first forward pass sets up kernels (vLLM: oneDNN's)
                await engine.generate(prompts[0], GREEDY, 2)
            for repeat in range(args.repeats):
                order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
                for name in order:
                    result = await run_agentic(engines[name], name, args, tokenizer, model_dir)
                    runs[name]["agentic"].append(result)
                    print(
                        f"repeat {repeat + 1} {name}: agentic {result['wall_s']:.1f} s, mean turn "
                        f"{result['turn_s']:.2f} s, hit rate {result['hit_rate']:.3f}",
                        file=sys.stderr,
                    )
                for name in order:
                    result = await run_batch(engines[name], name, args, prompts, model_dir)
                    runs[name]["batch"].append(result)
                    print(
                        f"repeat {repeat + 1} {name}: batch {result['tokens_per_s']:.1f} tokens/s, decode "
                        f"{result['decode_tokens_per_s']:.1f} tokens/s, first token {result['first_token_s']:.2f} s",
                        file=sys.stderr,
                    )
        finally:
            for engine in engines.values():
                await engine.release()

    try:
        local.start()
        print(f"local engine at {local.url} (started in {local.start_s:.1f} s)", file=sys.stderr)
        vllm, reason = (None, None) if args.vllm_url else start_vllm(args, model_dir)
        if args.vllm_url:
            print(f"vLLM at {args.vllm_url} (already running)", file=sys.stderr)
        elif vllm is not None:
            print(f"vLLM at {vllm.url} (started in {vllm.start_s:.1f} s)", file=sys.stderr)
        else:
            print(f"vLLM not measured: {reason}", file=sys.stderr)
        vllm_url = args.vllm_url or (vllm.url if vllm is not None else None)
        urls = {LOCAL: local.url} | ({VLLM: vllm_url} if vllm_url else {})
        runs.update({name: {"agentic": [], "batch": []} for name in urls})
        asyncio.run(measure(urls))
        rss = vllm.rss_bytes() if vllm is not None else 0
    finally:
        local.stop()
        if vllm is not None:
            vllm.stop()

    def med(name: str, part: str, key: str) -> float | None:
        if name not in runs:
            return None
        return statistics.median(r[key] for r in runs[name][part])

    result: dict[str, Any] = {}
    for name in (LOCAL, VLLM):
        result.update(
            {
                f"{name}_turn_s": med(name, "agentic", "turn_s"),
                f"{name}_agentic_wall_s": med(name, "agentic", "wall_s"),
                f"{name}_prefix_hit_rate": med(name, "agentic", "hit_rate"),
                f"{name}_batch_tokens_per_s": med(name, "batch", "tokens_per_s"),
                f"{name}_decode_tokens_per_s": med(name, "batch", "decode_tokens_per_s"),
                f"{name}_first_token_s": med(name, "batch", "first_token_s"),
            }
        )
    comparison: dict[str, Any] = {
        "local_vs_vllm_decode_tokens_per_s_ratio": None,
        "local_vs_vllm_turn_time_ratio": None,
        "local_vs_vllm_batch_tokens_per_s_ratio": None,
        "identical_agentic_outputs": None,
        "identical_batch_outputs": None,
        "max_logprob_diff": None,
        "mean_logprob_diff": None,
    }
    if VLLM in runs:
        same_a, diffs_a = zip(
            *(
                compare_sessions(x["generations"], y["generations"])
                for x, y in zip(runs[LOCAL]["agentic"], runs[VLLM]["agentic"], strict=True)
            ),
            strict=True,
        )
        same_b, diffs_b = zip(
            *(
                compare(x["generations"], y["generations"])
                for x, y in zip(runs[LOCAL]["batch"], runs[VLLM]["batch"], strict=True)
            ),
            strict=True,
        )
        diffs = [d for ds in (*diffs_a, *diffs_b) for d in ds]
        comparison.update(
            local_vs_vllm_decode_tokens_per_s_ratio=result["local_decode_tokens_per_s"]
            / result["vllm_decode_tokens_per_s"],
            local_vs_vllm_turn_time_ratio=result["local_turn_s"] / result["vllm_turn_s"],
            local_vs_vllm_batch_tokens_per_s_ratio=result["local_batch_tokens_per_s"]
            / result["vllm_batch_tokens_per_s"],
            identical_agentic_outputs=f"{min(same_a)}/{args.sessions}",
            identical_batch_outputs=f"{min(same_b)}/{args.batch}",
            max_logprob_diff=max(diffs, default=0.0),
            mean_logprob_diff=statistics.mean(diffs) if diffs else 0.0,
        )
    summary = {
        **comparison,
        **result,
        "vllm_unavailable": reason,
        "local_start_s": local.start_s,
        "vllm_start_s": vllm.start_s if vllm is not None else None,
        "vllm_rss_mb": round(rss / 2**20) if vllm is not None else None,
        "agentic_prompt_tokens": runs[LOCAL]["agentic"][0]["prompt_tokens"],
        "batch_prompt_tokens": len(prompts[0]),
        "threads": args.threads,
        "sessions": args.sessions,
        "turns": args.turns,
        "turn_tokens": args.turn_tokens,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "dtype": "float32",
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
