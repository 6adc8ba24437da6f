"""pytest log parsing and SWE-bench 5.x grading.

Rules: a F2P test counts only if PASSED or XFAIL (missing, SKIPPED, FAILED, ERROR, XPASS all fail); a P2P test
fails if missing, FAILED or ERROR (SKIPPED/XPASS are fine). Resolved = every F2P and every P2P test ok.

The log is read from `pytest -rA -v`: per-test verbose lines ("<nodeid> PASSED [ 50%]") and the short test
summary. The log is *untrusted* (the agent's code runs inside the test process), so it must be consistent:
exactly one summary header and one final counts line, no test with two different outcomes, the counts line
matching the parsed outcomes, and the exit code matching the log. A log that fails those checks, has no
parsable result, or comes from a pytest usage/internal error is an infrastructure error — never a silent 0.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
F2P_OK = {"PASSED", "XFAIL"}
P2P_BAD = {"FAILED", "ERROR"}

_VERBOSE = re.compile(
    r"^(?P<id>\S.*?::.*?) (?P<st>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)(?:\s+\(.*\))?\s*(?:\[\s*\d+%\])?$"
)
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
_FINAL = re.compile(r"^=+ (?P<body>.*?) in [\d.]+s(?: \([^)]*\))? =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected|warnings?)")
_COUNT_KEY = {
    "passed": "PASSED",
    "failed": "FAILED",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "XPASS",
    "error": "ERROR",
    "errors": "ERROR",
}


@dataclass
class ParsedLog:
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> status
    collection_errors: list[str] = field(default_factory=list)  # files that failed to import
    counts: dict[str, int] = field(
        default_factory=dict
    )  # from the final "=== 1 failed, 2 passed in 0.1s ===" line
    problems: list[str] = field(default_factory=list)  # inconsistencies: the log cannot be trusted


def parse_pytest_log(log: str) -> ParsedLog:
    out = ParsedLog()
    lines = log.splitlines()
    headers = [i for i, ln in enumerate(lines) if _SUMMARY_HEADER.match(ln)]
    finals = [i for i, ln in enumerate(lines) if _FINAL.match(ln)]
    if len(headers) > 1:
        out.problems.append(f"{len(headers)} 'short test summary info' sections (expected 1)")
    if len(finals) > 1:
        out.problems.append(f"{len(finals)} final result lines (expected 1)")
    if finals:
        body = _FINAL.match(lines[finals[-1]]).group("body")  # type: ignore[union-attr]
        for n, word in _COUNT.findall(body):
            key = _COUNT_KEY.get(word)
            if key:
                out.counts[key] = out.counts.get(key, 0) + int(n)
    verbose: dict[str, str] = {}
    verbose_counts: Counter[str] = Counter()
    summary_start = headers[-1] if headers else len(lines)
    for ln in lines[:summary_start]:
        m = _VERBOSE.match(ln)
        if m:
            nid, st = m.group("id"), m.group("st")
            verbose_counts[st] += 1
            if nid in verbose and verbose[nid] != st and not (verbose[nid] == "PASSED" and st == "ERROR"):
                out.problems.append(f"{nid}: reported both {verbose[nid]} and {st}")
            # a teardown error after a pass makes the test an ERROR (pytest prints both)
            verbose[nid] = st if nid not in verbose or st == "ERROR" else verbose[nid]
    summary: dict[str, str] = {}
    summary_end = finals[-1] if finals else len(lines)
    for ln in lines[summary_start + 1 : summary_end] if headers else []:
        word, _, rest = ln.partition(" ")
        if word not in STATUSES or word == "SKIPPED":  # "SKIPPED [1] file:line: reason" has no node id
            continue
        nid = rest.split(" - ", 1)[0].strip()
        if word == "ERROR" and "::" not in nid:
            out.collection_errors.append(nid)
            continue
        if nid in summary and summary[nid] != word:
            out.problems.append(f"{nid}: summary says both {summary[nid]} and {word}")
        summary[nid] = word
    out.outcomes = dict(verbose)
    for nid, st in summary.items():
        if (
            nid in verbose
            and verbose[nid] != st
            and not (st == "ERROR" and verbose[nid] in ("PASSED", "FAILED"))
        ):
            out.problems.append(f"{nid}: verbose line says {verbose[nid]}, summary says {st}")
        out.outcomes[nid] = st
    if out.counts and headers:
        for key in ("PASSED", "FAILED", "XFAIL", "XPASS", "SKIPPED"):
            if out.counts.get(key, 0) != verbose_counts.get(key, 0):
                out.problems.append(
                    f"final line reports {out.counts.get(key, 0)} {key}, the log shows "
                    f"{verbose_counts.get(key, 0)}"
                )
    return out


@dataclass
class Grade:
    status: str  # resolved | unresolved | infra_error
    resolved: bool
    reward: float | None
    f2p_fraction: float | None
    tests: dict[str, dict] = field(
        default_factory=dict
    )  # id -> {"kind": F2P|P2P, "outcome": str, "ok": bool}
    detail: str = ""


def exit_code_problem(exit_code: int, parsed: ParsedLog) -> str:
    bad = [t for t, s in parsed.outcomes.items() if s in ("FAILED", "ERROR")] + parsed.collection_errors
    if exit_code == 0 and bad:
        return f"pytest exited 0 but the log shows {len(bad)} failing test(s), e.g. {bad[0]}"
    if exit_code == 1 and not bad:
        return "pytest exited 1 (tests failed) but the log shows no failing test"
    if exit_code == 2 and not bad:
        return "pytest exited 2 (interrupted) but the log shows no error"
    if exit_code in (3, 4):
        return f"pytest exited {exit_code} (internal or usage error)"
    if exit_code == 5:
        return "pytest exited 5: no tests were collected"
    if exit_code not in (0, 1, 2):
        return f"pytest exited with unexpected code {exit_code}"
    return ""


def grade(fail_to_pass: list[str], pass_to_pass: list[str], log: str, exit_code: int) -> Grade:
    parsed = parse_pytest_log(log)
    tests: dict[str, dict] = {}
    for kind, ids in (("F2P", fail_to_pass), ("P2P", pass_to_pass)):
        for t in ids:
            outcome = parsed.outcomes.get(t, "MISSING")
            ok = outcome in F2P_OK if kind == "F2P" else outcome not in P2P_BAD | {"MISSING"}
            tests[t] = {"kind": kind, "outcome": outcome, "ok": ok}
    f2p_ok = sum(1 for t in fail_to_pass if tests[t]["ok"])
    f2p_fraction = f2p_ok / len(fail_to_pass) if fail_to_pass else None
    problem = "; ".join(parsed.problems) or exit_code_problem(exit_code, parsed)
    if not problem and not parsed.outcomes and not parsed.collection_errors:
        problem = "no parsable test results in the pytest log"
    if problem:
        return Grade("infra_error", False, None, f2p_fraction, tests, f"inconsistent test log: {problem}")
    resolved = all(v["ok"] for v in tests.values()) and bool(tests)
    failing = [t for t, v in tests.items() if not v["ok"]]
    detail = (
        ""
        if resolved
        else f"{len(failing)} test(s) not ok, e.g. {failing[0]} ({tests[failing[0]]['outcome']})"
    )
    return Grade(
        "resolved" if resolved else "unresolved",
        resolved,
        1.0 if resolved else 0.0,
        f2p_fraction,
        tests,
        detail,
    )
