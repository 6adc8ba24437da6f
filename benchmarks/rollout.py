"""Rollout throughput and where a turn's time goes, on this machine.

Three measurements, side by side in one run (timings on a shared machine are noisy; compare the ratios):
  1. sandbox cost per command: `true` through the bubblewrap sandbox vs a plain subprocess (the baseline);
  2. harness + gateway + sandbox cost per turn with NO model time: the generate stage against the gateway's
     fast engine server (a scripted token API) running shell commands in bubblewrap;
  3. the same stage on the real tiny model (SmolLM2-135M on CPU): rollouts/hour and model seconds per turn;
  4. executors: the no-model run of 2. with `--executor threads` vs `--executor ray` (local Ray on this
     machine, started once before the timed runs; its start-up time is reported separately), interleaved.
Headline: rollouts_per_hour (real model), model_s_per_turn, overhead_s_per_turn (harness + gateway + sandbox,
from 2) and overhead_vs_model (2 / 3 per turn). The last line printed is one JSON object.

    .venv/bin/python benchmarks/rollout.py [--tasks DIR] [--rollouts 2] [--turns 2] [--max-tokens 16]
        [--executor-rollouts 8] [--executor-repeats 2] [--skip-real-model]
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    import ray

    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0
    walls: dict[str, list[float]] = {"threads": [], "ray": []}
    try:
        generate(
            tasks, work / "warm", [spec], concurrency, model, ExecutorName.RAY, concurrency
        )  # workers up
        for i in range(repeats):
            for executor in ExecutorName:
                m = generate(tasks, work / f"{executor}{i}", [spec], rollouts, model, executor, concurrency)
                assert m["status"].get("ok", 0) == m["rollouts"], m["status"]
                walls[executor].append(m["wall_s"])
    finally:
        ray.shutdown()
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
    args = ap.parse_args()

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
                f"ray.init {ex['ray_init_s']:.1f} s",
                flush=True,
            )
        finally:
            engine.stop()

        real = None
        if not args.skip_real_model:
            real = generate(tasks, work / "real", [spec], args.rollouts, ModelSource())
            print(
                f"tiny model: {real['rollouts']} rollouts in {real['wall_s']:.1f} s = "
                f"{real['rollouts_per_hour']:.0f}/h; model {real['model_s_per_turn']:.2f} s/turn, tools "
                f"{real['tool_s_per_turn']:.3f} s/turn, status {real['status']}",
                flush=True,
            )
    result = {}
    if real is not None:
        result.update(
            {
                "rollouts_per_hour": round(real["rollouts_per_hour"], 1),
                "turns": real["turns"],
                "model_s_per_turn": round(real["model_s_per_turn"], 3),
                "tool_s_per_turn": round(real["tool_s_per_turn"], 4),
                "overhead_vs_model": round(overhead / real["model_s_per_turn"], 4)
                if real["model_s_per_turn"]
                else None,
                "setup_s_per_rollout": round(real["setup_s_mean"], 3),
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
