"""Generates the grading corpus: the projects of cases.py, each run with verify's exact pytest command line in
the real bubblewrap sandbox, the log kept as pytest wrote it (2 MiB output cap and truncation marker included).

    .venv/bin/python -m tests.verify.pytest_corpus.generate [--only NAME ...]

Writes `cases.json` (one record per case: ids, run, witness run, verdicts) and `logs/` beside this file.
The sandbox's env is this interpreter's environment (the one verify's per-repo envs point to) with
`PYTHONPATH=/workspace` standing in for the env's workspace path file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

from harnessrl.io import atomic_write_bytes, atomic_write_json
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.verify.filtering import test_files_of
from harnessrl.verify.grading import PytestRun
from harnessrl.verify.verifier import as_pytest_run, pytest_argv
from tests.verify.pytest_corpus.cases import Spec, specs

HERE = Path(__file__).resolve().parent
GZIP_OVER = 64 << 10  # logs larger than this are stored gzipped


def run_tree(spec: Spec, files: dict[str, str]) -> tuple[PytestRun, str]:
    """Runs verify's pytest command on `files` in a new sandbox; returns the run and the end of its stderr."""
    test_files = sorted(test_files_of(spec.f2p) | test_files_of(spec.p2p))
    with tempfile.TemporaryDirectory(prefix="pytest-corpus-") as tmp:
        tree = Path(tmp) / "tree"
        for rel, text in files.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
        env = Path(sys.prefix)
        with BubblewrapSandbox(tree, env, git_stub=True, extra_env={"PYTHONPATH": "/workspace"}) as sandbox:
            result = sandbox.run(pytest_argv(test_files), timeout=spec.timeout_s, limits=spec.limits)
    return as_pytest_run(result), result.stderr[-2000:]


def _store(name: str, log: str) -> str:
    data = log.encode("utf-8", "surrogateescape")
    rel = f"logs/{name}.log"
    if len(data) > GZIP_OVER:
        rel += ".gz"
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(HERE / rel, data)
    return rel


def generate(spec: Spec) -> dict:
    run, stderr = run_tree(spec, spec.files)
    record = {
        "name": spec.name,
        "f2p": spec.f2p,
        "p2p": spec.p2p,
        "files": sorted(spec.files),
        "run": {"log": _store(spec.name, run.log), "exit_code": run.exit_code, "stopped": run.stopped},
        "stderr_tail": stderr,
        "witness": None,
        "swebench": spec.swebench,
        "reason": spec.reason,
        "expected": spec.expected or spec.swebench,
        "difference": spec.difference,
        "findings": list(spec.findings),
    }
    if spec.witness is not None:
        w, _ = run_tree(spec, {**spec.files, **spec.witness})
        record["witness"] = {
            "log": _store(f"{spec.name}.witness", w.log),
            "exit_code": w.exit_code,
            "stopped": w.stopped,
        }
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", help="regenerate these cases, keep the others")
    args = ap.parse_args(argv)
    import pytest

    all_specs = specs()
    names = [sp.name for sp in all_specs]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate case names")
    unknown = set(args.only or []) - set(names)
    if unknown:
        raise SystemExit(f"--only: unknown case(s) {sorted(unknown)}; known: {names}")
    index = HERE / "cases.json"
    old = {c["name"]: c for c in json.loads(index.read_text())["cases"]} if args.only else {}
    cases = []
    for sp in all_specs:
        if args.only and sp.name not in args.only:
            cases.append(old[sp.name])
            continue
        print(f"  {sp.name} ...", flush=True)
        cases.append(generate(sp))
    if not args.only:
        keep = {c["run"]["log"] for c in cases} | {c["witness"]["log"] for c in cases if c["witness"]}
        for stale in (HERE / "logs").iterdir():
            if f"logs/{stale.name}" not in keep:
                stale.unlink()
    atomic_write_json(
        index,
        {
            "pytest": pytest.__version__,
            "python": sys.version.split()[0],
            "command": pytest_argv(["<test files>"]),
            "cases": cases,
        },
    )
    print(f"{len(cases)} cases -> {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
