"""Reading an untrusted `pytest -rA -v` log and grading it with SWE-bench 5.x rules.

Rules: an F2P test is ok only if PASSED or XFAIL (missing, SKIPPED, FAILED, ERROR and XPASS fail); a P2P test is
ok if PASSED, XFAIL or SKIPPED. An id stored cut short (more `[` than `]`, as SWE-bench datasets hold some
parametrized ids) stands for every test it prefixes, and is ok only if all of them are. Resolved = every F2P
and P2P test ok. When a test has several results (an error at teardown after its call), the last line pytest's
summary prints for it decides, as in SWE-bench's parser: passes, skips, xfails, xpasses, errors, failures.

The log has regions, and only two are read: the *run* (the `-v` lines, from "collected N items" to the first
section header) and the *summary* (from the last "short test summary info" header to the final counts line).
Everything between them — failure reports, captured output, the whole sessions that `pytester` prints — is
ignored. The agent's code runs in the test process, so the log must also hold together (`LogState`):

- INCONSISTENT (tampering: infra_error): pytest-like lines after the final line, counts that differ from the
  summary, a test whose `-v` results differ from its summary results or that never started, a result counted
  but no summary, exit status 0 with failures in the log;
- INCOMPLETE (the session ended abnormally: no final line, killed, pytest.exit, nothing collected, a non-zero
  exit status with no failing test): the caller decides with the unpatched tree as witness (`judge`);
- COMPLETE: graded.

Output over the sandbox's cap keeps its head and tail around one marker line; such a log is checked for its
structure only, and a listed test whose result was cut out is an infra_error unless another one already fails.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from harnessrl.sandbox.outcomes import MAX_OUTPUT_BYTES
from harnessrl.schema import RewardName


class VerifyStatus(StrEnum):
    RESOLVED = "resolved"  # reward 1
    UNRESOLVED = "unresolved"  # reward 0
    TIMEOUT = "timeout"  # the tests hung: reward 0
    RESOURCE_LIMIT = "resource_limit"  # the tests blew their memory/process limits: reward 0
    APPLY_FAILED = "apply_failed"  # the agent's diff does not apply: reward 0
    INFRA_ERROR = "infra_error"  # no reward: never trained as 0


GRADED = frozenset(VerifyStatus) - {VerifyStatus.INFRA_ERROR}  # the statuses that carry a reward


class PytestOutcome(StrEnum):
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"
    ERROR = "ERROR"
    FAILED = "FAILED"
    MISSING = "MISSING"  # not in the log


class LogState(StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    INCONSISTENT = "inconsistent"


_O = PytestOutcome
F2P_OK = frozenset({_O.PASSED, _O.XFAIL})
P2P_OK = frozenset({_O.PASSED, _O.XFAIL, _O.SKIPPED})
_RANK = {o: i for i, o in enumerate(_O)}  # summary order: a later line wins
_FAILING = frozenset({_O.FAILED, _O.ERROR})

_WORDS = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
_VERBOSE = re.compile(rf"^(?P<id>\S.*?::.*?) (?P<st>{_WORDS})(?: \(.*\))?\s*(?:\[[^\]]*\])?$")
_SUMMARY_LINE = re.compile(rf"^(?P<st>{_WORDS})(?: at (?:setup|call|teardown) of)? (?P<rest>.+)$")
_SKIP_FOLDED = re.compile(r"^SKIPPED \[(?P<n>\d+)\] ")
_HEADER = re.compile(r"^=+ .+ =+$")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
_FINAL = re.compile(r"^=+ (?P<body>.*?) in [\d.]+s(?: \([^)]*\))? =+$")
_BANNER = re.compile(r"^!+ (?P<text>.*) !+$")
_COLLECTED = re.compile(r"^(?:collecting \.\.\. )?collected \d+ items?\b")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)\b")
_COUNT_KEY = {
    "passed": _O.PASSED,
    "failed": _O.FAILED,
    "skipped": _O.SKIPPED,
    "xfailed": _O.XFAIL,
    "xpassed": _O.XPASS,
    "error": _O.ERROR,
    "errors": _O.ERROR,
}
# the sandbox keeps MAX_OUTPUT_BYTES of a longer stream: half from the head, half from the tail, around this
_CUT_LINE = re.compile(r"^\[\.\.\. \d+ bytes truncated \.\.\.\]$")
_CUT = re.compile(r"\n\[\.\.\. \d+ bytes truncated \.\.\.\]\n")
_EXIT_MEANING = {
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


@dataclass
class ParsedLog:
    outcomes: dict[str, PytestOutcome] = field(default_factory=dict)  # node id -> result
    collection_errors: list[str] = field(default_factory=list)  # files (or collectors) that failed to collect
    # from the final "=== 1 failed, 2 passed in 0.1s ===" line
    counts: dict[PytestOutcome, int] = field(default_factory=dict)
    skipped: int = 0  # skips in the summary ("SKIPPED [N] file:line: reason"), with or without a test id
    truncated: bool = False  # the sandbox cut the middle of the output
    summary_cut: bool = False  # ... and the cut reaches into the summary
    inconsistent: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)


def _cut_line(log: str, lines: list[str]) -> int | None:
    """Index of the sandbox's truncation marker, if the log carries one where the sandbox puts it."""
    marks = [i for i, ln in enumerate(lines) if _CUT_LINE.match(ln)]
    found = list(_CUT.finditer(log))
    if len(marks) != 1 or len(found) != 1:
        return None
    half = MAX_OUTPUT_BYTES // 2

    def fits(text: str) -> bool:  # undecodable bytes became U+FFFD (3 bytes for 1-3 raw bytes)
        n = len(text.encode("utf-8", "surrogateescape"))
        return n - 2 * text.count("\ufffd") <= half <= n

    return marks[0] if fits(log[: found[0].start()]) and fits(log[found[0].end() :]) else None


def _imitates_pytest(line: str) -> bool:
    m = _SUMMARY_LINE.match(line)
    return bool(
        _HEADER.match(line) or _VERBOSE.match(line) or (m and ("::" in m["rest"] or _SKIP_FOLDED.match(line)))
    )


def _entry_id(word: PytestOutcome, rest: str, known: set[str]) -> str:
    """The node id of a summary line "<WORD> <id>[ - <message>]" (ids may contain " - " themselves)."""
    if word is _O.PASSED or rest in known:  # a pass carries no message
        return rest
    cuts = [m.start() for m in re.finditer(" - ", rest)]
    return next((rest[:c] for c in cuts if rest[:c] in known), rest[: cuts[0]] if cuts else rest)


def _verbose(lines: list[str]) -> tuple[dict[str, list[PytestOutcome]], list[str]]:
    """-v results per node id, and the lines that start a test but were split by live output."""
    results: dict[str, list[PytestOutcome]] = {}
    split: list[str] = []
    for ln in lines:
        m = _VERBOSE.match(ln)
        if m:
            results.setdefault(m["id"], []).append(_O(m["st"]))
        elif "::" in ln:
            split.append(ln)
    return results, split


def parse_pytest_log(log: str) -> ParsedLog:
    out = ParsedLog()
    lines = log.split("\n")
    cut = _cut_line(log, lines)
    out.truncated = cut is not None
    finals = [i for i, ln in enumerate(lines) if _FINAL.match(ln)]
    end = finals[-1] if finals else len(lines)
    if not finals:
        out.incomplete.append("no final result line: the session did not finish")
    else:
        for n, word in _COUNT.findall(lines[end]):
            out.counts[_COUNT_KEY[word]] = out.counts.get(_COUNT_KEY[word], 0) + int(n)
        after = next((ln for ln in lines[end + 1 :] if _imitates_pytest(ln)), None)
        if after is not None:
            out.inconsistent.append(f"pytest-like output after the session ended: {after[:120]!r}")

    first = next((i for i in range(end) if _COLLECTED.match(lines[i])), end)
    stop = next((i for i in range(first + 1, end) if i == cut or _HEADER.match(lines[i])), end)
    verbose, split = _verbose(lines[first + 1 : stop])
    weak: dict[str, list[PytestOutcome]] = {}  # after a cut in the run: more -v lines, or captured output
    if cut is not None and stop == cut:
        weak_end = next((i for i in range(cut + 1, end) if _HEADER.match(lines[i])), end)
        weak = _verbose(lines[cut + 1 : weak_end])[0]

    headers = [i for i in range(end) if _SUMMARY_HEADER.match(lines[i])] if finals else []
    start = headers[-1] if headers else None
    if cut is not None and cut < end and finals and (start is None or start < cut):
        out.summary_cut, start = True, cut
    summary: dict[str, list[PytestOutcome]] = {}
    known = set(verbose) | set(weak)
    for ln in lines[start + 1 : end] if start is not None else []:
        skip, m = _SKIP_FOLDED.match(ln), _SUMMARY_LINE.match(ln)
        if skip:
            out.skipped += int(skip["n"])
        elif m:
            word = _O(m["st"])
            nid = _entry_id(word, m["rest"], known)
            if word is _O.ERROR and "::" not in nid:
                out.collection_errors.append(nid)
            summary.setdefault(nid, []).append(word)
    for nid in [n for n in verbose if " " in n]:  # "<id> <live output> PASSED": output, not a result
        if any(nid[: m.start()] in summary for m in re.finditer(" ", nid)):
            split.append(nid)
            del verbose[nid]
    if finals and start is None and any(out.counts.values()):
        out.inconsistent.append(f"the final line counts results ({lines[end]!r}) but there is no summary")

    if start is not None and not out.summary_cut:
        entries = Counter(w for ws in summary.values() for w in ws)
        for key in (_O.PASSED, _O.FAILED, _O.XFAIL, _O.XPASS, _O.ERROR, _O.SKIPPED):
            shown = out.skipped if key is _O.SKIPPED else entries[key]
            if out.counts.get(key, 0) != shown:
                out.inconsistent.append(
                    f"the final line counts {out.counts.get(key, 0)} {key}, the summary shows {shown}"
                )
    if start is not None and not out.truncated:
        out.inconsistent += _cross_check(verbose, split, summary, out.skipped)

    for nid, words in {**weak, **verbose}.items():
        if nid not in summary:
            summary[nid] = words
        elif _O.SKIPPED in words:  # skipped, then an error at teardown
            summary[nid] = [*summary[nid], _O.SKIPPED]
    out.outcomes = {nid: max(words, key=_RANK.__getitem__) for nid, words in summary.items()}
    for nid in out.collection_errors:
        out.outcomes.pop(nid, None)
    return out


def _cross_check(
    verbose: dict[str, list[PytestOutcome]],
    split: list[str],
    summary: dict[str, list[PytestOutcome]],
    skipped: int,
) -> list[str]:
    """-v lines against the summary: the same results per test, and no result for a test that never started."""
    problems = []

    def started(nid: str) -> bool:  # its -v line was split by live output ("<id> some outputPASSED")
        return any(ln.startswith(nid + " ") for ln in split)

    for nid in verbose.keys() | summary.keys():
        ran = Counter(w for w in verbose.get(nid, []) if w is not _O.SKIPPED)
        said = Counter(summary.get(nid, []))
        if ran == said or (ran <= said and (started(nid) or set(said - ran) <= {_O.ERROR})):
            continue  # an ERROR without a -v line is a collector's (a module, a class) error
        ran_s, said_s = ", ".join(sorted(ran.elements())), ", ".join(sorted(said.elements()))
        problems.append(f"{nid}: the -v lines say [{ran_s}], the summary [{said_s}]")
    shown = sum(w is _O.SKIPPED for ws in verbose.values() for w in ws)
    if shown > skipped:
        problems.append(f"{shown} skipped tests in the -v lines, {skipped} in the summary")
    return problems


def log_state(parsed: ParsedLog, exit_code: int | None) -> tuple[LogState, str]:
    """Whether the log can be graded, and why not; the exit status must agree with it."""
    if parsed.inconsistent:
        return LogState.INCONSISTENT, "; ".join(parsed.inconsistent)
    if parsed.incomplete:
        return LogState.INCOMPLETE, "; ".join(parsed.incomplete)
    failing = [t for t, o in parsed.outcomes.items() if o in _FAILING] + parsed.collection_errors
    if exit_code is None:
        return LogState.INCOMPLETE, "pytest has no exit status"
    meaning = _EXIT_MEANING.get(exit_code, f"signal {exit_code - 128}" if exit_code > 128 else "unexpected")
    if exit_code == 0 and failing:
        return (
            LogState.INCONSISTENT,
            f"pytest exited 0 but the log shows {len(failing)} failing, e.g. {failing[0]}",
        )
    if exit_code != 0 and not failing and not (parsed.summary_cut and exit_code == 1):
        return LogState.INCOMPLETE, f"pytest exited {exit_code} ({meaning}) but the log shows no failing test"
    if not parsed.outcomes and not parsed.collection_errors:
        return LogState.INCOMPLETE, "no test results in the log"
    return LogState.COMPLETE, ""


@dataclass
class Grade:
    status: VerifyStatus
    resolved: bool
    reward: float | None
    f2p_fraction: float | None
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {"kind", "outcome", "ok"}
    detail: str = ""
    state: LogState = LogState.COMPLETE


def _results(test_id: str, outcomes: dict[str, PytestOutcome]) -> list[PytestOutcome]:
    if test_id in outcomes:
        return [outcomes[test_id]]
    if test_id.count("[") > test_id.count("]"):  # stored cut short: every test it prefixes (SWE-bench #290)
        return [o for nid, o in outcomes.items() if nid.startswith(test_id)]
    return []


def grade(fail_to_pass: list[str], pass_to_pass: list[str], log: str, exit_code: int | None) -> Grade:
    parsed = parse_pytest_log(log)
    tests: dict[str, dict[str, Any]] = {}
    for kind, ids, allowed in (("F2P", fail_to_pass, F2P_OK), ("P2P", pass_to_pass, P2P_OK)):
        for t in ids:
            found = _results(t, parsed.outcomes)
            outcome = max(found, key=_RANK.__getitem__) if found else _O.MISSING
            tests[t] = {"kind": kind, "outcome": outcome, "ok": bool(found) and set(found) <= allowed}
            if len(found) > 1 or (found and t not in parsed.outcomes):
                tests[t]["matched"] = len(found)
    f2p_ok = sum(1 for t in fail_to_pass if tests[t]["ok"])
    f2p_fraction = f2p_ok / len(fail_to_pass) if fail_to_pass else None
    state, problem = log_state(parsed, exit_code)
    if state is not LogState.COMPLETE:
        return Grade(
            VerifyStatus.INFRA_ERROR, False, None, f2p_fraction, tests, f"{state} test log: {problem}", state
        )
    failing = [t for t, v in tests.items() if not v["ok"]]
    lost = [t for t in failing if tests[t]["outcome"] is _O.MISSING]
    if parsed.truncated and lost and len(lost) == len(failing):
        detail = f"the output cap cut out the result of {len(lost)} listed test(s), e.g. {lost[0]}"
        return Grade(VerifyStatus.INFRA_ERROR, False, None, f2p_fraction, tests, detail, state)
    resolved = not failing and bool(tests)
    detail = (
        f"{len(failing)} test(s) not ok, e.g. {failing[0]} ({tests[failing[0]]['outcome']})"
        if failing
        else ""
    )
    status = VerifyStatus.RESOLVED if resolved else VerifyStatus.UNRESOLVED
    return Grade(status, resolved, float(resolved), f2p_fraction, tests, detail, state)


@dataclass(frozen=True)
class PytestRun:
    log: str  # pytest's stdout
    exit_code: int | None
    stopped: VerifyStatus | None = None  # TIMEOUT / RESOURCE_LIMIT when the sandbox stopped the run


def judge(
    fail_to_pass: list[str], pass_to_pass: list[str], run: PytestRun, witness: Callable[[], PytestRun]
) -> Grade:
    """The verdict on a run of the patched tree. `witness` runs the unpatched tree (only called when the patched
    run ended abnormally): if that run completes, the patch caused the crash (0); if not, the environment did."""
    g = grade(fail_to_pass, pass_to_pass, run.log, run.exit_code)
    if run.stopped is not None:
        fraction = 0.0 if g.f2p_fraction is not None else None
        return replace(
            g, status=run.stopped, resolved=False, reward=0.0, f2p_fraction=fraction, detail=run.stopped
        )
    if g.state is not LogState.INCOMPLETE:
        return g
    w = witness()
    wg = grade(fail_to_pass, pass_to_pass, w.log, w.exit_code)
    if w.stopped is None and wg.state is LogState.COMPLETE:
        detail = f"{g.detail}; the unpatched tree's run completes, so the patch caused this"
        return replace(g, status=VerifyStatus.UNRESOLVED, reward=0.0, detail=detail)
    why = f"stopped: {w.stopped}" if w.stopped is not None else wg.detail
    return replace(g, detail=f"{g.detail}; the unpatched tree's run fails too ({why}): the environment")


def reward_for(
    name: RewardName, status: VerifyStatus, resolved: bool, f2p_fraction: float | None
) -> float | None:
    """The reward a harness spec names for a verdict: `swebench` 1/0 (resolved or not); `f2p_fraction` the share
    of FAIL_TO_PASS tests that pass when the tests ran to a verdict (resolved/unresolved), 0 for a diff that does
    not apply or tests that hung or blew their limits. None (never trained as 0) for an infra error."""
    if status is VerifyStatus.INFRA_ERROR:
        return None
    if name is RewardName.F2P_FRACTION and status in (VerifyStatus.RESOLVED, VerifyStatus.UNRESOLVED):
        return float(resolved) if f2p_fraction is None else f2p_fraction
    return float(resolved)
