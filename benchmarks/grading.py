"""Grading agreement with SWE-bench 5.x on the corpus of real pytest runs (tests/verify/pytest_corpus).

    .venv/bin/python benchmarks/grading.py [--repeats 5] [--smoke]

`--smoke`: one timed pass (the agreement figures are the full run's; the timing is rougher).

Each corpus case is a real run of verify's pytest command line in the sandbox (and, for runs that end
abnormally, of the unpatched tree as witness), with the verdict SWE-bench 5.x's rules give it. A case agrees
when verify grades it as SWE-bench does (reward 1 vs 0: timeout and resource_limit are 0s) or, for a
deliberate difference documented in docs/verify.md, exactly as documented. `swebench_reward_agreement` counts
the deliberate differences as disagreements.

The last line printed is one JSON object: grading_agreement, swebench_reward_agreement, cases, per finding...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="timed passes over the corpus")
    ap.add_argument("--smoke", action="store_true", help="one timed pass (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats = 1

    from harnessrl.verify.grading import VerifyStatus
    from tests.verify.pytest_corpus import corpus_info, load_cases
    from tests.verify.pytest_corpus.cases import Finding

    cases = load_cases()
    verdicts = {c.name: c.judge() for c in cases}
    agree = [c for c in cases if c.agrees(verdicts[c.name].status)]
    zero = VerifyStatus.RESOLVED, VerifyStatus.INFRA_ERROR
    same_reward = [
        c
        for c in cases
        if (verdicts[c.name].status is VerifyStatus.RESOLVED) == (c.swebench is VerifyStatus.RESOLVED)
        and (verdicts[c.name].status not in zero) == (c.swebench is VerifyStatus.UNRESOLVED)
    ]
    for c in cases:
        g = verdicts[c.name]
        mark = "ok " if c in agree else "BAD"
        note = f" [deliberate: {c.difference}]" if c.difference else ""
        print(f"  {mark} {c.name:40s} swebench={c.swebench:10s} verify={g.status:14s}{note}")
        if c not in agree:
            print(f"        why SWE-bench: {c.reason}\n        verify: {g.detail}")
    per_finding = {}
    for f in Finding:
        mine = [c for c in cases if f in c.findings]
        per_finding[f.value] = round(sum(c in agree for c in mine) / len(mine), 4)

    t0 = time.perf_counter()
    logs = 0
    for _ in range(args.repeats):
        for c in cases:
            c.judge()
            logs += 1 + (c.witness is not None)
    wall = time.perf_counter() - t0
    log_mb = sum(len(c.run.log.encode()) for c in cases) / 1e6

    result = {
        "grading_agreement": round(len(agree) / len(cases), 4),
        "swebench_reward_agreement": round(len(same_reward) / len(cases), 4),
        "cases": len(cases),
        "agreeing": len(agree),
        "deliberate_differences": sum(bool(c.difference) for c in cases),
        "verdicts": dict(sorted(Counter(str(g.status) for g in verdicts.values()).items())),
        "agreement_by_finding": per_finding,
        "grading_ms_per_case": round(1000 * wall / (args.repeats * len(cases)), 3),
        "corpus_log_mb": round(log_mb, 2),
        "pytest": corpus_info()["pytest"],
    }
    print(
        f"grading agreement with SWE-bench 5.x: {result['grading_agreement']:.2%} of {len(cases)} cases "
        f"({result['deliberate_differences']} deliberate, documented differences counted as agreement; "
        f"{result['swebench_reward_agreement']:.2%} without them)"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
