"""Generate a SWE-smith-format task set at dataset scale for the clean/validate benchmark.

    .venv/bin/python benchmarks/make_swesmith_rows.py --out /tmp/swesmith-60k [--rows 60000 --repos 128]
    .venv/bin/python benchmarks/make_swesmith_rows.py --smoke [--out DIR]   # 400 rows, 4 repos, seconds

Rows look like SWE-smith's (59,136 tasks over 128 repos): bug patches of a few KB (1-3 hunks), 1-50 tests,
problem statements of a few hundred chars. One bundle per repo holds `main` plus a branch per task (all
pointing at the main commit: the check reads refs, not trees). A known share of rows breaks each cleaning
rule, so the expected kept/rejected counts are printed; the last line is JSON: rows, repos, jsonl_mb,
expected_rejections, expected_rejected_rows, seconds. `--smoke` writes to a temporary folder (removed) unless
`--out` is given.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dataprep.gitrepo import init_squashed
from harnessrl.taskset import write_taskset

# share of rows that break one rule each (duplicates copy an earlier row verbatim, so they also carry
# duplicate_patch: clean keeps every reason of a row)
BAD_SHARES = {
    "empty_problem_statement": 0.02,
    "missing_task_branch": 0.01,
    "too_many_tests": 0.01,
    "empty_fail_to_pass": 0.01,
    "unparsable_patch": 0.005,
    "duplicate_instance_id": 0.01,
    "missing_repo_bundle": 0.005,
}
MODIFIERS = (
    "func_pm_op_change",
    "func_pm_op_flip",
    "func_pm_op_swap",
    "func_pm_remove_assign",
    "func_pm_remove_cond",
    "func_pm_remove_loop",
    "func_pm_ctrl_invert_if",
    "func_pm_op_change_const",
)
WORDS = (
    "value",
    "result",
    "items",
    "index",
    "self",
    "config",
    "node",
    "parser",
    "token",
    "buffer",
    "count",
    "name",
    "path",
    "data",
    "options",
    "context",
    "response",
    "key",
    "default",
    "offset",
)


def code_line(rng: random.Random) -> str:
    a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
    return rng.choice(
        (
            f"        {a} = {b}.get({c!r}, None)",
            f"        if {a} is not None and {b} > {c}:",
            f"            return {a}[{b}:{c}]",
            f"        for {a} in {b}.{c}():",
            f"        {a} += len({b}) * {rng.randint(1, 9)}",
            f"        raise ValueError({a!r} + str({b}))",
        )
    )


def make_patch(rng: random.Random, path: str) -> str:
    out = [
        f"diff --git a/{path} b/{path}",
        f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
        f"--- a/{path}",
        f"+++ b/{path}",
    ]
    line = rng.randint(10, 200)
    for _ in range(rng.randint(1, 3)):
        before = [code_line(rng) for _ in range(rng.randint(8, 20))]
        after = [code_line(rng) for _ in range(rng.randint(8, 20))]
        removed = [code_line(rng) for _ in range(rng.randint(1, 4))]
        added = [code_line(rng) for _ in range(rng.randint(1, 4))]
        old_n, new_n = len(before) + len(removed) + len(after), len(before) + len(added) + len(after)
        out.append(
            f"@@ -{line},{old_n} +{line},{new_n} @@ def {rng.choice(WORDS)}_{rng.choice(WORDS)}(self):"
        )
        out += [" " + x for x in before] + ["-" + x for x in removed] + ["+" + x for x in added]
        out += [" " + x for x in after]
        line += old_n + rng.randint(20, 80)
    return "\n".join(out) + "\n"


def make_rows(
    n: int, n_repos: int, seed: int
) -> tuple[list[dict], dict[str, list[str]], dict[str, int], int]:
    """Rows, the branches each repo's bundle must hold, how many rows break each rule, and how many rows clean
    must reject."""
    rng = random.Random(seed)
    repos = [f"swesmith/{rng.choice(WORDS)}{i}.{rng.getrandbits(32):08x}" for i in range(n_repos)]
    missing_repo = repos[-1]  # its bundle is not written
    branches: dict[str, list[str]] = {r: [] for r in repos[:-1]}
    rows: list[dict] = []
    expected = dict.fromkeys([*BAD_SHARES, "duplicate_patch"], 0)
    rejected_rows = 0
    good: list[int] = []
    for i in range(n):
        kind = None
        u = rng.random()
        acc = 0.0
        for name, share in BAD_SHARES.items():
            acc += share
            if u < acc:
                kind = name
                break
        if kind == "duplicate_instance_id" and not good:
            kind = None
        if kind == "duplicate_instance_id":
            rows.append(dict(rows[good[rng.randrange(len(good))]]))  # a copy of a row that is otherwise fine
            expected[kind] += 1
            expected["duplicate_patch"] += 1
            rejected_rows += 1
            continue
        repo = missing_repo if kind == "missing_repo_bundle" else rng.choice(repos[:-1])
        name = repo.split("/", 1)[1]
        iid = f"{name.rsplit('.', 1)[0]}.{name.rsplit('.', 1)[1][:7]}__{rng.choice(MODIFIERS)}__{i}"
        module = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
        n_tests = rng.randint(1, 50)
        n_f2p = rng.randint(1, min(5, n_tests))
        tests = [f"tests/test_{rng.choice(WORDS)}.py::test_{rng.choice(WORDS)}_{j}" for j in range(n_tests)]
        row = {
            "instance_id": iid,
            "repo": repo,
            "patch": make_patch(rng, module),
            "FAIL_TO_PASS": tests[:n_f2p],
            "PASS_TO_PASS": tests[n_f2p:],
            "image_name": f"swesmith.x86_64.{name}",
            "problem_statement": " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 120))) + ".",
            "created_at": f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T12:00:00",
        }
        if kind == "empty_problem_statement":
            row["problem_statement"] = ""
        elif kind == "too_many_tests":
            row["PASS_TO_PASS"] = [f"tests/test_many.py::test_{j}" for j in range(rng.randint(201, 400))]
        elif kind == "empty_fail_to_pass":
            row["FAIL_TO_PASS"] = []
        elif kind == "unparsable_patch":
            row["patch"] = row["patch"][: len(row["patch"]) // 2]
        if kind is not None:
            expected[kind] += 1
            rejected_rows += 1
        else:
            good.append(len(rows))
        if kind not in ("missing_task_branch", "missing_repo_bundle"):
            branches[repo].append(iid)
        rows.append(row)
    return rows, branches, expected, rejected_rows


def make_bundles(branches: dict[str, list[str]], scratch: Path) -> dict[str, Path]:
    bundles = {}
    for i, (repo, names) in enumerate(sorted(branches.items())):
        d = scratch / f"r{i}"
        d.mkdir()
        (d / "README.md").write_text(f"{repo}\n")
        sha = init_squashed(d, "2025-01-01T00:00:00Z")
        # one packed-refs file instead of ~470 loose ref files per repo (creating and deleting 60k small
        # files dominates otherwise); the format is git's own (`git pack-refs`)
        refs = sorted({f"refs/heads/{b}" for b in names} | {"refs/heads/main"})
        (d / ".git" / "packed-refs").write_text(
            "# pack-refs with: peeled fully-peeled sorted \n" + "".join(f"{sha} {r}\n" for r in refs)
        )
        (d / ".git" / "refs" / "heads" / "main").unlink()
        out = scratch / f"r{i}.bundle"
        subprocess.run(
            ["git", "bundle", "create", "-q", str(out), "--all"], cwd=d, check=True, capture_output=True
        )
        bundles[repo] = out
    return bundles


def generate(out: Path, n_rows: int, n_repos: int, seed: int) -> dict[str, object]:
    """Writes the task set to `out`; returns the summary the last line prints."""
    start = time.perf_counter()
    rows, branches, expected, rejected_rows = make_rows(n_rows, n_repos, seed)
    with tempfile.TemporaryDirectory() as tmp:
        bundles = make_bundles(branches, Path(tmp))
        write_taskset(
            out,
            rows,
            bundles,
            source="benchmarks/make_swesmith_rows.py",
            extra_manifest={"expected_rejections": expected, "expected_rejected_rows": rejected_rows},
        )
    size_mb = (out / "tasks.jsonl").stat().st_size / 2**20
    print(f"{len(rows)} rows ({size_mb:.0f} MB JSONL), {len(bundles)} bundles -> {out}", file=sys.stderr)
    return {
        "rows": len(rows),
        "repos": len(bundles),
        "jsonl_mb": round(size_mb, 1),
        "expected_rejections": expected,
        "expected_rejected_rows": rejected_rows,
        "seconds": round(time.perf_counter() - start, 2),
    }


SMOKE_ROWS, SMOKE_REPOS = 400, 4  # every planted rule still occurs (tests/dataprep/test_clean_rules.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="task-set folder to write (required unless --smoke)")
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--repos", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--smoke", action="store_true", help=f"{SMOKE_ROWS} rows over {SMOKE_REPOS} repos (seconds)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.repos = SMOKE_ROWS, SMOKE_REPOS
    elif args.out is None:
        ap.error("--out is required (unless --smoke)")
    if args.out is not None:
        print(json.dumps(generate(args.out, args.rows, args.repos, args.seed)))
        return 0
    with tempfile.TemporaryDirectory(prefix="swesmith-rows-") as tmp:
        print(json.dumps(generate(Path(tmp) / "tasks", args.rows, args.repos, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
