"""Rollout throughput and where a turn's time goes, on this machine.

Three measurements, side by side in one run (timings on a shared machine are noisy; compare the ratios):
  1. sandbox cost per command: `true` through the bubblewrap sandbox vs a plain subprocess (the baseline);
  2. harness + gateway + sandbox cost per turn with NO model time: the generate stage against the gateway's
     fast engine server (a scripted token API) running shell commands in bubblewrap;
  3. the same stage on the real tiny model (SmolLM2-135M on CPU, the in-process LocalEngine): rollouts/hour,
     model seconds per turn and the engine's prefill/decode split, with the engine's prefix cache off vs on
     (alternating, `--repeats` times each), then (`--thread-settings 1,2,auto`) cache on with each torch thread
     setting (`--contended`: again with a busy-loop process taking one core, as another job would), all with
     the gateway and bubblewrap sandboxes running beside the engine;
  4. executors: the no-model run of 2. with `--executor threads` vs `--executor ray` (a local Ray cluster on
     this machine, LocalRayCluster, started and connected once before the timed runs; its start-up time is
     reported separately as ray_init_s), interleaved.
Headline: rollouts_per_hour and model_s_per_turn (real model, cache on), prefix_cache_rollouts_speedup
(rollouts/hour on / off), overhead_s_per_turn (harness + gateway + sandbox, from 2) and overhead_vs_model
(2 / 3 per turn). The last line printed is one JSON object.

    .venv/bin/python benchmarks/rollout.py [--tasks DIR] [--rollouts 2] [--turns 2] [--max-tokens 16]
        [--repeats 1] [--threads auto] [--thread-settings 1,2,auto] [--contended] [--executor-rollouts 8]
        [--executor-repeats 2]
        [--skip-real-model] [--skip-executors] [--smoke]

`--smoke`: every part at its smallest (3 sandbox commands, 2 rollouts of 1 turn x 8 tokens on the real model,
2 turns without a model, one threads-vs-Ray repetition of 2 rollouts); the figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harnessrl.rollout.executors import ExecutorName
from harnessrl.rollout.model_server import ModelSource


def _tasks(path: str | None, work: Path) -> Path:
    if path:
        return Path(path)
    from dataprep.synthesize import synthesize_taskset

    repo = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "minirepo"
    out = work / "tasks"
    synthesize_taskset(repo, out, max_tasks=2, seed=0)
    return out


def sandbox_per_command(tasks: Path, work: Path, n: int) -> dict:
    from harnessrl.harness.runtime import LocalSubprocessRuntime, SandboxRuntime
    from harnessrl.sandbox.bwrap import BubblewrapSandbox
    from harnessrl.sandbox.envs import ensure_env
    from harnessrl.sandbox.workspace import materialize
    from harnessrl.taskset import TaskSet

    ts = TaskSet.open(tasks)
    row = ts.rows()[0]
    ws = materialize(ts, row["instance_id"], work / "ws")
    bwrap = SandboxRuntime(BubblewrapSandbox(ws, ensure_env(ts, row["repo"])), ws)
    local = LocalSubprocessRuntime(ws)
    times: dict[str, list[float]] = {"bwrap": [], "local": []}
    for _ in range(n):  # interleaved so load changes hit both alike
        for name, rt in (("bwrap", bwrap), ("local", local)):
            t0 = time.perf_counter()
            res = rt.run_shell("true", timeout=30)
            times[name].append(time.perf_counter() - t0)
            assert res.outcome == "ok", res
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "bwrap_s_per_command": med["bwrap"],
        "local_s_per_command": med["local"],
        "sandbox_overhead_ratio": med["bwrap"] / med["local"],
    }


def generate(
    tasks: Path,
    out: Path,
    specs: list[dict],
    rollouts: int,
    model: ModelSource,
    executor: ExecutorName = ExecutorName.THREADS,
    concurrency: int | None = None,
) -> dict:
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.specs import parse_specs

    n_tasks = 2
    return run_generate(
        tasks,
        out,
        parse_specs(specs),
        model,
        GenerateConfig(
            group_size=max(1, rollouts // n_tasks),
            concurrency=concurrency or rollouts,
            max_tasks=n_tasks,
            executor=executor,
        ),
    )


def executors_side_by_side(
    tasks: Path, work: Path, spec: dict, rollouts: int, concurrency: int, repeats: int, model: ModelSource
) -> dict:
    """Same no-model generate run with threads and with local Ray, interleaved `repeats` times."""
    from harnessrl.rollout.ray_cluster import LocalRayCluster

    t0 = time.perf_counter()
    walls: dict[str, list[float]] = {"threads": [], "ray": []}
    with LocalRayCluster() as cluster:  # the executors find this process connected to it
        cluster.connect()
        ray_init_s = time.perf_counter() - t0
        generate(
            tasks, work / "warm", [spec], concurrency, model, ExecutorName.RAY, concurrency
        )  # workers up
        for i in range(repeats):
            for executor in ExecutorName:
                m = generate(tasks, work / f"{executor}{i}", [spec], rollouts, model, executor, concurrency)
                assert m["status"].get("ok", 0) == m["rollouts"], m["status"]
                walls[executor].append(m["wall_s"])
    med = {k: statistics.median(v) for k, v in walls.items()}
    n = max(1, rollouts // 2) * 2
    return {
        "threads_rollouts_per_hour": n / med["threads"] * 3600,
        "ray_rollouts_per_hour": n / med["ray"] * 3600,
        "ray_vs_threads_throughput": med["threads"] / med["ray"],
        "ray_init_s": ray_init_s,
        "executor_rollouts": n,
        "executor_concurrency": concurrency,
    }


def _real_summary(m: dict) -> dict:
    engine = m.get("engine") or {}
    return {
        "rollouts_per_hour": round(m["rollouts_per_hour"], 1),
        "model_s_per_turn": round(m["model_s_per_turn"], 3),
        "tool_s_per_turn": round(m["tool_s_per_turn"], 4),
        "setup_s_per_rollout": round(m["setup_s_mean"], 3),
        "turns": m["turns"],
        "wall_s": round(m["wall_s"], 1),
        "status": m["status"],
        "cache_hit_rate": engine.get("prefix_cache_hit_rate"),
        "prefill_s_per_request": round(engine.get("prefill_s_per_request", 0.0), 3),
        "decode_s_per_request": round(engine.get("decode_s_per_request", 0.0), 3),
        "threads": engine.get("threads"),
        "adaptive_threads": engine.get("adaptive_threads"),
    }


def _threads(setting: str) -> int | None:
    return None if setting == "auto" else int(setting)


def real_model(tasks: Path, work: Path, spec: dict, args: argparse.Namespace) -> dict:
    """Cache off vs on (alternating), then cache on per thread count; medians of rollouts/hour."""
    runs: dict[str, list[dict]] = {"cache_off": [], "cache_on": []}
    load = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        order = ["cache_off", "cache_on"] if repeat % 2 == 0 else ["cache_on", "cache_off"]
        for label in order:
            source = ModelSource(
                prefix_cache_mb=0 if label == "cache_off" else None, threads=_threads(args.threads)
            )
            m = _real_summary(generate(tasks, work / f"real-{label}-{repeat}", [spec], args.rollouts, source))
            runs[label].append(m)
            print(f"tiny model, prefix {label.replace('_', ' ')}: {m}", flush=True)
    by_threads: dict[str, dict] = {}
    for contended in [False, True] if args.contended else [False]:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if contended else None
        try:
            for setting in [t.strip() for t in args.thread_settings.split(",") if t.strip()]:
                name = f"{setting}, contended" if contended else setting
                source = ModelSource(threads=_threads(setting))
                m = _real_summary(
                    generate(tasks, work / f"real-threads-{len(by_threads)}", [spec], args.rollouts, source)
                )
                by_threads[name] = {
                    k: m[k] for k in ("rollouts_per_hour", "model_s_per_turn", "turns", "threads")
                }
                print(f"tiny model, cache on, torch threads {name}: {m}", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    load.append(os.getloadavg()[0])

    def median_run(label: str) -> dict:
        ordered = sorted(runs[label], key=lambda r: r["rollouts_per_hour"])
        return ordered[len(ordered) // 2]

    return {
        "cache_off": median_run("cache_off"),
        "cache_on": median_run("cache_on"),
        "by_threads": by_threads,
        "load": [round(x, 2) for x in load],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", help="task-set dir (default: synthesize 2 tasks from tests/fixtures/minirepo)")
    ap.add_argument("--rollouts", type=int, default=2, help="rollouts per run (over 2 tasks)")
    ap.add_argument("--turns", type=int, default=2, help="turns per rollout on the real model")
    ap.add_argument("--scripted-turns", type=int, default=6, help="turns per rollout in the no-model run")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--commands", type=int, default=20, help="commands for the per-command sandbox timing")
    ap.add_argument(
        "--executor-rollouts", type=int, default=8, help="rollouts per run in the threads-vs-ray part"
    )
    ap.add_argument("--executor-concurrency", type=int, default=4)
    ap.add_argument("--executor-repeats", type=int, default=2)
    ap.add_argument("--skip-real-model", action="store_true", help="leave out part 3 (the slow one)")
    ap.add_argument("--skip-executors", action="store_true", help="leave out part 4 (threads vs Ray)")
    ap.add_argument("--repeats", type=int, default=1, help="real model: runs per prefix cache setting")
    ap.add_argument(
        "--thread-settings",
        default="",
        help="real model: comma-separated torch thread settings to compare with the cache on (e.g. 1,2,auto)",
    )
    ap.add_argument(
        "--contended",
        action="store_true",
        help="real model: repeat --thread-settings with a busy-loop process on one core (another job)",
    )
    ap.add_argument(
        "--threads",
        default="auto",
        help="real model: torch threads of the cache off/on runs (a number, or auto: the engine's adaptive default)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="every part at its smallest (the figures mean nothing)"
    )
    args = ap.parse_args()
    if args.smoke:
        args.commands, args.rollouts, args.turns, args.scripted_turns, args.max_tokens = 3, 2, 1, 2, 8
        args.executor_rollouts, args.executor_concurrency, args.executor_repeats, args.repeats = 2, 2, 1, 1

    from harnessrl.tinymodel import load_tokenizer
    from tests.support.fast_engine import FastEngineServer

    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        work = Path(tmp)
        tasks = _tasks(args.tasks, work)
        cmd = sandbox_per_command(tasks, work, args.commands)
        print(
            f"sandbox: bwrap {cmd['bwrap_s_per_command'] * 1000:.1f} ms/command vs plain subprocess "
            f"{cmd['local_s_per_command'] * 1000:.1f} ms ({cmd['sandbox_overhead_ratio']:.1f}x)",
            flush=True,
        )

        tool = (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls minicalc && python -c pass"}}'
            "\n</tool_call>"
        )
        engine = FastEngineServer(load_tokenizer(), [{"text": tool}])
        engine.start()
        spec = {
            "harness": "react",
            "sandbox": "bubblewrap",
            "limits": {"turns": args.turns, "wall_s": 600},
            "options": {"max_tokens_per_turn": args.max_tokens, "min_tokens_per_turn": 8},
        }
        # the scripted reply is ~40 tokens: give it room (the token cap only matters to the real model)
        scripted_spec = {
            **spec,
            "limits": {**spec["limits"], "turns": args.scripted_turns},
            "options": {**spec["options"], "max_tokens_per_turn": 128},
        }
        try:
            scripted = generate(
                tasks,
                work / "scripted",
                [scripted_spec],
                args.rollouts,
                ModelSource(engine_url=engine.base_url),
            )
            overhead = (
                scripted["tool_s_per_turn"]
                + scripted["harness_overhead_s_per_turn"]
                + scripted["model_s_per_turn"]
            )
            print(
                f"no-model run: {scripted['rollouts']} rollouts, {scripted['turns']} turns, "
                f"{overhead:.3f} s/turn harness+gateway+sandbox ({scripted['tool_s_per_turn']:.3f} s of it in "
                "tools)",
                flush=True,
            )
            ex = None
            if not args.skip_executors:
                ex = executors_side_by_side(
                    tasks,
                    work,
                    scripted_spec,
                    args.executor_rollouts,
                    args.executor_concurrency,
                    args.executor_repeats,
                    ModelSource(engine_url=engine.base_url),
                )
                print(
                    f"executors (no model, {ex['executor_rollouts']} rollouts, concurrency "
                    f"{ex['executor_concurrency']}): threads {ex['threads_rollouts_per_hour']:.0f}/h, ray "
                    f"{ex['ray_rollouts_per_hour']:.0f}/h (x{ex['ray_vs_threads_throughput']:.2f}); "
                    f"local Ray start + connect {ex['ray_init_s']:.1f} s",
                    flush=True,
                )
        finally:
            engine.stop()

        real = None
        if not args.skip_real_model:
            real = real_model(tasks, work, spec, args)
    result: dict = {}
    if real is not None:
        on = real["cache_on"]
        result.update(
            {
                "rollouts_per_hour": on["rollouts_per_hour"],
                "model_s_per_turn": on["model_s_per_turn"],
                "rollouts_per_hour_cache_off": real["cache_off"]["rollouts_per_hour"],
                "model_s_per_turn_cache_off": real["cache_off"]["model_s_per_turn"],
                "prefix_cache_rollouts_speedup": round(
                    on["rollouts_per_hour"] / real["cache_off"]["rollouts_per_hour"], 3
                ),
                "prefix_cache_model_s_speedup": round(
                    real["cache_off"]["model_s_per_turn"] / on["model_s_per_turn"], 3
                ),
                "cache_hit_rate": on["cache_hit_rate"],
                "turns": on["turns"],
                "tool_s_per_turn": on["tool_s_per_turn"],
                "overhead_vs_model": round(overhead / on["model_s_per_turn"], 4)
                if on["model_s_per_turn"]
                else None,
                "setup_s_per_rollout": on["setup_s_per_rollout"],
                "engine_threads": args.threads,
                "by_threads": real["by_threads"],
                "real_model_load": real["load"],
            }
        )
    result.update(
        {
            "overhead_s_per_turn": round(overhead, 4),
            "no_model_rollouts_per_hour": round(scripted["rollouts_per_hour"], 1),
            "no_model_gateway_s_per_turn": round(scripted["model_s_per_turn"], 4),
            "no_model_tool_s_per_turn": round(scripted["tool_s_per_turn"], 4),
            "bwrap_ms_per_command": round(cmd["bwrap_s_per_command"] * 1000, 2),
            "plain_ms_per_command": round(cmd["local_s_per_command"] * 1000, 2),
            "sandbox_overhead_ratio": round(cmd["sandbox_overhead_ratio"], 2),
        }
    )
    if ex is not None:
        result.update(
            {
                "threads_rollouts_per_hour": round(ex["threads_rollouts_per_hour"], 1),
                "ray_rollouts_per_hour": round(ex["ray_rollouts_per_hour"], 1),
                "ray_vs_threads_throughput": round(ex["ray_vs_threads_throughput"], 3),
                "ray_init_s": round(ex["ray_init_s"], 2),
                "executor_rollouts": ex["executor_rollouts"],
                "executor_concurrency": ex["executor_concurrency"],
            }
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
