"""Verify overhead and throughput, against the same pytest command run bare, measured side by side.

    .venv/bin/python benchmarks/verify.py [--source tests/fixtures/minirepo] [--repeats 5] [--parallel 8] [--smoke]

1. overhead: the full verification of one rollout (framework diff, filter, fresh bug-commit tree, apply, new
   bubblewrap sandbox, grade) vs. `python -m pytest <same args> <same test files>` run bare on a prepared tree;
   also the sandbox alone (same command in bubblewrap on the same tree). With podman here, the same two
   measurements on the podman backend (a fresh container of the repo's environment image per verification):
   overhead_ratio_podman, podman_sandbox_ratio. Runs are interleaved so load on the shared host hits every
   side alike; medians are compared.
2. throughput: N gold-fix rollouts through the verify stage with 1 worker and with 2 workers.

The last line printed is one JSON object: overhead_ratio, sandbox_ratio, overhead_ratio_podman,
verifications_per_min, load_avg, ... `--smoke`: one repetition, 2 rollouts for the throughput (seconds, plus
the environment image's first build where podman runs); the figures mean nothing.
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

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--source",
        type=Path,
        default=REPO / "tests" / "fixtures" / "minirepo",
        help="repo (or sdist) to synthesize the benchmark task from",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=8, help="rollouts for the throughput measurement")
    ap.add_argument("--smoke", action="store_true", help="one repetition, 2 rollouts (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.parallel = 1, 2

    from dataprep.synthesize import synthesize_taskset
    from harnessrl.io import write_jsonl
    from harnessrl.sandbox.backends import SandboxChoice
    from harnessrl.sandbox.base import Limits
    from harnessrl.sandbox.bwrap import BubblewrapSandbox
    from harnessrl.sandbox.envs import ensure_env
    from harnessrl.sandbox.images import ensure_env_image, podman_problem
    from harnessrl.sandbox.podman import PodmanSandbox
    from harnessrl.sandbox.workspace import RepoCache, materialize
    from harnessrl.schema import SandboxKind
    from harnessrl.taskset import TaskSet
    from harnessrl.verify.rollouts import run_verify
    from harnessrl.verify.verifier import PYTEST_ARGS, verify_workspace

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp_s:
        tmp = Path(tmp_s)
        print(f"synthesizing a task from {args.source} ...", flush=True)
        ts: TaskSet = synthesize_taskset(args.source, tmp / "tasks", max_tasks=1, seed=0)
        row = ts.rows()[0]
        iid = row["instance_id"]
        env = ensure_env(ts, row["repo"])
        podman = podman_problem() is None
        image, podman_row = "", row
        if podman:
            print("building the repo's environment image (cached after the first run) ...", flush=True)
            image = ensure_env_image(ts, row["repo"])
            podman_row = {**row, "image_name": image}
        else:
            print(f"podman backend not measured: {podman_problem()}", flush=True)
        cache = RepoCache.for_repo(ts, row["repo"])
        test_files = sorted({t.split("::")[0] for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]})

        def gold_workspace(dest: Path) -> Path:
            ws = materialize(ts, iid, dest)
            subprocess.run(
                ["patch", "-p1", "-R", "--batch", "--quiet"],
                input=row["patch"],
                text=True,
                cwd=ws,
                check=True,
            )
            return ws

        ws = gold_workspace(tmp / "ws")
        # the bare baseline runs on the tree verify would build: bug commit + fix, tests present
        bare_tree = tmp / "bare"
        cache.export(cache.bug_commit(iid), bare_tree)
        subprocess.run(
            ["patch", "-p1", "-R", "--batch", "--quiet"],
            input=row["patch"],
            text=True,
            cwd=bare_tree,
            check=True,
        )
        bare_args = [a.replace("/workspace", str(bare_tree)) for a in PYTEST_ARGS]
        bare_cmd = [str(env / "bin" / "python"), "-P", "-m", "pytest", *bare_args, *test_files]

        bare, sandboxed, full, pod_sandboxed, pod_full = [], [], [], [], []
        loads = [os.getloadavg()[0]]
        for i in range(args.repeats):
            t0 = time.perf_counter()
            p = subprocess.run(
                bare_cmd,
                cwd=bare_tree,
                capture_output=True,
                text=True,
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(bare_tree), "HOME": str(tmp)},
            )
            bare.append(time.perf_counter() - t0)
            assert p.returncode == 0, p.stdout[-2000:]
            t0 = time.perf_counter()
            with BubblewrapSandbox(bare_tree, env) as sb:
                r = sb.run(["python", "-P", "-m", "pytest", *PYTEST_ARGS, *test_files], timeout=300)
            sandboxed.append(time.perf_counter() - t0)
            assert r.ok, r.stdout[-2000:]
            t0 = time.perf_counter()
            v = verify_workspace(ts, row, ws)
            full.append(time.perf_counter() - t0)
            assert v.resolved, v.detail
            podman_line = ""
            if podman:
                t0 = time.perf_counter()
                with PodmanSandbox(bare_tree, image, Limits()) as sb:
                    r = sb.run(["python", "-P", "-m", "pytest", *PYTEST_ARGS, *test_files], timeout=300)
                pod_sandboxed.append(time.perf_counter() - t0)
                assert r.ok, r.stdout[-2000:] + r.stderr[-2000:]
                t0 = time.perf_counter()
                v = verify_workspace(ts, podman_row, ws, sandbox=SandboxChoice(SandboxKind.PODMAN))
                pod_full.append(time.perf_counter() - t0)
                assert v.resolved, v.detail
                podman_line = f" | podman {pod_sandboxed[-1]:.2f} s | podman verify {pod_full[-1]:.2f} s"
            loads.append(os.getloadavg()[0])
            print(
                f"  run {i + 1}: bare {bare[-1]:.2f} s | sandbox {sandboxed[-1]:.2f} s | full verify {full[-1]:.2f} s"
                f"{podman_line} | load {loads[-1]:.1f}",
                flush=True,
            )

        rollouts = tmp / "rollouts"
        rows = []
        for i in range(args.parallel):
            gold_workspace(rollouts / f"ws{i}")
            rows.append({"rollout_id": f"r{i}", "instance_id": iid, "workspace": f"ws{i}"})
        write_jsonl(rollouts / "rollouts.jsonl", rows)
        throughput = {}
        for workers in (1, 2):
            s = run_verify(ts.root, rollouts, tmp / f"out{workers}", workers=workers)
            assert s["resolved"] == args.parallel, s
            throughput[workers] = s["verifications_per_min"]
            print(
                f"  {args.parallel} verifications, {workers} worker(s): {s['wall_s']:.1f} s "
                f"= {s['verifications_per_min']:.1f}/min",
                flush=True,
            )

    # On a shared host wall times are noisy: the headline uses the fastest run of each (the least disturbed);
    # the ratio of medians is reported too. (CPU time is not comparable: bwrap does not reap its pid namespace's
    # init, so the sandboxed processes' rusage never reaches us.)
    b, sb_, f = min(bare), min(sandboxed), min(full)
    med = {k: statistics.median(v) for k, v in (("bare", bare), ("sandbox", sandboxed), ("verify", full))}
    result = {
        "task": iid,
        "tests": len(row["FAIL_TO_PASS"]) + len(row["PASS_TO_PASS"]),
        "repeats": args.repeats,
        "bare_s": round(b, 3),
        "sandbox_s": round(sb_, 3),
        "verify_s": round(f, 3),
        "sandbox_ratio": round(sb_ / b, 3),
        "overhead_ratio": round(f / b, 3),
        "overhead_ratio_median": round(med["verify"] / med["bare"], 3),
        "verifications_per_min": throughput[2],
        "verifications_per_min_1_worker": throughput[1],
        "parallel_speedup": round(throughput[2] / throughput[1], 3),
        "parallel_rollouts": args.parallel,
        "load_avg": [round(x, 2) for x in (min(loads), statistics.median(loads), max(loads))],
    }
    if pod_full:
        result |= {
            "podman_sandbox_s": round(min(pod_sandboxed), 3),
            "podman_verify_s": round(min(pod_full), 3),
            "podman_sandbox_ratio": round(min(pod_sandboxed) / b, 3),
            "overhead_ratio_podman": round(min(pod_full) / b, 3),
            "overhead_ratio_podman_median": round(statistics.median(pod_full) / med["bare"], 3),
        }
    print(
        f"overhead: full verify / bare pytest = {result['overhead_ratio']}x fastest-run, "
        f"{result['overhead_ratio_median']}x median (target <= 1.5x); "
        f"sandbox alone = {result['sandbox_ratio']}x; 2 workers vs 1 = {result['parallel_speedup']}x"
    )
    if pod_full:
        print(
            f"podman: full verify / bare pytest = {result['overhead_ratio_podman']}x fastest-run, "
            f"{result['overhead_ratio_podman_median']}x median (target <= 2.0x); "
            f"container alone = {result['podman_sandbox_ratio']}x"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
