"""Load + clean + validate a SWE-smith-scale task set; targets: <= 60 s and <= 2 GB peak RSS for 60,000 rows.

    .venv/bin/python benchmarks/make_swesmith_rows.py --out /tmp/swesmith-60k
    .venv/bin/python benchmarks/clean.py --tasks /tmp/swesmith-60k
    .venv/bin/python benchmarks/clean.py --smoke    # seconds: make_swesmith_rows.py's 400-row set, made here

Prints the split (load / clean rules+write / validate) and, as the in-run baseline for the branch check,
the time `git bundle list-heads` once per repo takes against once per row (timed on a sample of rows and
extrapolated: running it 60,000 times would take minutes). Checks that kept + rejected == rows and that the
rejections match what the generator planted. The last line is JSON: rows, seconds, peak_rss_mb, ...
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from make_swesmith_rows import SMOKE_REPOS, SMOKE_ROWS, generate

from dataprep.clean import clean_taskset
from dataprep.gitrepo import bundle_heads
from dataprep.load import load_rows
from dataprep.validate import validate_frame, validate_taskset, validation_frame
from harnessrl.taskset import TaskSet


def cpu_seconds() -> float:
    """User+system CPU of this process and its finished children (git): unlike wall time, it does not grow
    when other jobs share the cores."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def branch_check_baseline(ts: TaskSet, rows: list[dict], sample: int, seed: int) -> tuple[float, float]:
    """(seconds for list-heads once per repo, extrapolated seconds for once per row)."""
    repos = sorted({r["repo"] for r in rows if ts.bundle(r["repo"]).is_file()})
    t = time.perf_counter()
    for repo in repos:
        bundle_heads(ts.bundle(repo))
    per_repo = time.perf_counter() - t
    picked = random.Random(seed).sample([r for r in rows if ts.bundle(r["repo"]).is_file()], sample)
    t = time.perf_counter()
    for r in picked:
        _ = r["instance_id"] in bundle_heads(ts.bundle(r["repo"]))
    per_row = (time.perf_counter() - t) / sample * len(rows)
    return per_repo, per_row


def gx_frame_baseline(rows: list[dict], n: int, seed: int) -> tuple[float, float]:
    """Seconds to validate n rows handed to GX verbatim (full diffs and test lists) vs as validation_frame."""
    import pandas as pd

    sample = random.Random(seed).sample(rows, n)
    view = validation_frame(sample)
    raw = pd.DataFrame(sample)
    for helper in ("tests_are_lists", "n_fail_to_pass", "f2p_p2p_disjoint"):
        raw[helper] = view[helper]
    validate_frame(view.head(10))  # warm up GX imports and caches for both
    t = time.perf_counter()
    validate_frame(raw)
    raw_s = time.perf_counter() - t
    t = time.perf_counter()
    validate_frame(view)
    return raw_s, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tasks", type=Path, help="task set from make_swesmith_rows.py (required unless --smoke)"
    )
    ap.add_argument(
        "--sample", type=int, default=200, help="rows timed for the per-row branch-check baseline"
    )
    ap.add_argument("--gx-sample", type=int, default=5000, help="rows for the GX full-frame baseline")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"without --tasks: make_swesmith_rows.py's {SMOKE_ROWS}-row set, made here; small baselines",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.sample, args.gx_sample = 20, 100
    elif args.tasks is None:
        ap.error("--tasks is required (unless --smoke)")

    with tempfile.TemporaryDirectory(prefix="bench-clean-") as tmp:
        out = Path(tmp)
        if args.tasks is None:
            args.tasks = out / "tasks"
            generate(args.tasks, SMOKE_ROWS, SMOKE_REPOS, seed=0)
        ts = TaskSet.open(args.tasks)
        c0, t0 = cpu_seconds(), time.perf_counter()
        report = clean_taskset(args.tasks, out / "kept", out / "rejected.jsonl")
        t1 = time.perf_counter()
        validation = validate_taskset(out / "kept", out / "validate", raise_on_failure=False)
        t2, c2 = time.perf_counter(), cpu_seconds()
        rss = peak_rss_mb()

        t = time.perf_counter()
        rows = load_rows(ts.tasks_path, allow_extra=True)
        load_s = time.perf_counter() - t
        per_repo_s, per_row_s = branch_check_baseline(ts, rows, args.sample, 0)
        gx_raw_s, gx_view_s = gx_frame_baseline(rows, min(args.gx_sample, len(rows)), 0)

    clean_s, validate_s = t1 - t0, t2 - t1
    total = clean_s + validate_s
    expected = ts.manifest.get("expected_rejections", {})
    planted_ok = all(report.reasons.get(k, 0) == v for k, v in expected.items())
    print(
        f"rows {report.n_in}: kept {report.n_kept} + rejected {report.n_rejected} "
        f"({'reconciles' if report.n_in == report.n_kept + report.n_rejected else 'MISMATCH'})",
        file=sys.stderr,
    )
    print(f"rejections by reason: {dict(sorted(report.reasons.items()))}", file=sys.stderr)
    print(
        f"planted by generator: {dict(sorted(expected.items()))} -> {'match' if planted_ok else 'DIFFER'}",
        file=sys.stderr,
    )
    print(
        f"validation on kept rows: {'passed' if validation.success else 'FAILED'} "
        f"({len(validation.outcomes)} expectations)",
        file=sys.stderr,
    )
    print(
        f"split: clean {clean_s:.1f} s (of which load ~{load_s:.1f} s) | validate {validate_s:.1f} s | "
        f"total {total:.1f} s wall, {c2 - c0:.1f} s CPU | peak RSS {rss:.0f} MB",
        file=sys.stderr,
    )
    print(
        f"branch check: list-heads per repo {per_repo_s:.2f} s vs per row ~{per_row_s:.0f} s "
        f"(x{per_row_s / max(per_repo_s, 1e-9):.0f})",
        file=sys.stderr,
    )
    print(
        f"GX on {min(args.gx_sample, len(rows))} rows: verbatim frame {gx_raw_s:.1f} s vs validation_frame "
        f"{gx_view_s:.1f} s (x{gx_raw_s / max(gx_view_s, 1e-9):.1f})",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "rows": report.n_in,
                "seconds": round(total, 2),
                "cpu_seconds": round(c2 - c0, 2),
                "peak_rss_mb": round(rss, 1),
                "kept": report.n_kept,
                "rejected": report.n_rejected,
                "reasons": dict(sorted(report.reasons.items())),
                "planted_rejections_match": planted_ok,
                "validation_success": validation.success,
                "clean_seconds": round(clean_s, 2),
                "load_seconds": round(load_s, 2),
                "validate_seconds": round(validate_s, 2),
                "validate_share": round(validate_s / total, 3),
                "branch_check_per_repo_seconds": round(per_repo_s, 3),
                "branch_check_per_row_seconds_est": round(per_row_s, 1),
                "branch_check_speedup": round(per_row_s / max(per_repo_s, 1e-9), 1),
                "gx_sample_rows": min(args.gx_sample, len(rows)),
                "gx_verbatim_frame_seconds": round(gx_raw_s, 2),
                "gx_validation_frame_seconds": round(gx_view_s, 2),
                "gx_frame_speedup": round(gx_raw_s / max(gx_view_s, 1e-9), 1),
                "targets_met": total <= 60 and rss <= 2048,
                "cpu_target_met": c2 - c0 <= 60 and rss <= 2048,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
