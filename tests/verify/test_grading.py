"""Grading on real pytest logs: the corpus (tests/verify/pytest_corpus: real runs of verify's command line in the
sandbox, each with SWE-bench 5.x's verdict), one test per reported defect, the forgery defences, and a fresh
run of a few corpus projects to show the stored logs still match the installed pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.verify.grading import (
    LogState,
    PytestOutcome,
    PytestRun,
    VerifyStatus,
    grade,
    judge,
    parse_pytest_log,
)
from harnessrl.verify.verifier import PYTEST_ARGS
from tests.support.fixtures import requires_bwrap
from tests.verify.pytest_corpus import Case, corpus_info, load_cases
from tests.verify.pytest_corpus.cases import Finding

CASES = {c.name: c for c in load_cases()}
REPO = Path(__file__).resolve().parents[2]


def _with(finding: Finding) -> list[Case]:
    return [c for c in CASES.values() if finding in c.findings]


def _ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


# -- the corpus as a whole ------------------------------------------------------------------------------------
def test_corpus_was_generated_with_the_installed_pytest():
    info = corpus_info()
    assert info["pytest"].split(".")[0] == pytest.__version__.split(".")[0], (
        f"the corpus was generated with pytest {info['pytest']}, this is {pytest.__version__}: regenerate it "
        "with `.venv/bin/python -m tests.verify.pytest_corpus.generate`"
    )
    assert info["command"][:-1] == ["python", "-P", "-m", "pytest", *PYTEST_ARGS]
    assert len(CASES) >= 50 and {f for c in CASES.values() for f in c.findings} == set(Finding)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_every_case_is_graded_as_swebench_or_as_documented(case: Case):
    g = case.judge()
    assert g.status is case.expected, (case.reason, g.detail)
    assert case.agrees(g.status)
    assert g.reward == {VerifyStatus.RESOLVED: 1.0, VerifyStatus.INFRA_ERROR: None}.get(g.status, 0.0)


def test_the_grading_benchmark_reports_agreement_on_its_last_line():
    p = subprocess.run(
        [sys.executable, "benchmarks/grading.py", "--repeats", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["cases"] == len(CASES) and result["grading_agreement"] >= 0.97
    assert result["deliberate_differences"] == sum(bool(c.difference) for c in CASES.values())


# -- one test per reported defect, over the corpus cases that exercise it -----------------------------------
@pytest.mark.parametrize("case", _with(Finding.TEARDOWN), ids=_ids(_with(Finding.TEARDOWN)))
def test_a_teardown_error_is_a_second_result_not_a_contradiction(case: Case):
    parsed = parse_pytest_log(case.run.log)
    assert parsed.inconsistent == [] and parsed.incomplete == []
    g = case.judge()
    assert g.state is LogState.COMPLETE and g.status is case.expected, g.detail
    if case.name == "teardown_error_f2p":  # PASSED, then ERROR at teardown: the error decides
        assert g.tests["test_calc.py::test_add"]["outcome"] is PytestOutcome.ERROR
    if case.name == "teardown_error_xfail_f2p":  # pytest reports an xfail test's teardown error as XFAIL
        assert g.tests["test_calc.py::test_add"]["outcome"] is PytestOutcome.XFAIL


@pytest.mark.parametrize("case", _with(Finding.IMPORTORSKIP), ids=_ids(_with(Finding.IMPORTORSKIP)))
def test_a_module_skipped_at_import_is_graded_not_an_infra_error(case: Case):
    parsed = parse_pytest_log(case.run.log)
    assert parsed.skipped == 1 and parsed.inconsistent == []
    g = case.judge()
    assert g.status is VerifyStatus.UNRESOLVED and g.reward == 0.0, g.detail
    assert g.tests["test_calc.py::test_add"]["outcome"] is PytestOutcome.MISSING


@pytest.mark.parametrize("case", _with(Finding.CAP), ids=_ids(_with(Finding.CAP)))
def test_output_over_the_sandbox_cap_is_graded_from_head_and_tail(case: Case):
    assert len(case.run.log.encode()) > 2 << 20
    parsed = parse_pytest_log(case.run.log)
    assert parsed.truncated and parsed.inconsistent == [] and parsed.incomplete == []
    g = case.judge()
    assert g.status is case.expected and g.state is LogState.COMPLETE, g.detail
    assert all(t["outcome"] is not PytestOutcome.MISSING for t in g.tests.values())


def test_a_forged_truncation_marker_is_not_believed():
    log = CASES["pass_all"].run.log
    lines = log.split("\n")
    forged = "\n".join([*lines[:6], "[... 123 bytes truncated ...]", *lines[6:]])
    assert not parse_pytest_log(forged).truncated
    real = CASES["output_cap_live"].run.log
    moved = real.replace("\n[... ", "\nX\n[... ", 1)  # the marker no longer sits where the sandbox puts it
    assert parse_pytest_log(real).truncated and not parse_pytest_log(moved).truncated


@pytest.mark.parametrize("case", _with(Finding.PYTESTER), ids=_ids(_with(Finding.PYTESTER)))
def test_inner_pytest_sessions_in_captured_output_are_ignored(case: Case):
    assert case.run.log.count("short test summary info") >= 3  # the inner sessions are in the log
    g = case.judge()
    assert g.status is case.expected and g.state is LogState.COMPLETE, g.detail
    parsed = parse_pytest_log(case.run.log)
    assert set(parsed.outcomes) == {"test_calc.py::test_add", "test_calc.py::test_mul"}  # no inner ids


@pytest.mark.parametrize("case", _with(Finding.PREFIX), ids=_ids(_with(Finding.PREFIX)))
def test_f2p_ids_stored_cut_short_match_every_test_they_prefix(case: Case):
    g = case.judge()
    assert g.status is case.expected, g.detail
    assert g.tests["test_calc.py::test_fmt[a"]["matched"] == 2
    # an id that is not cut short (balanced brackets) is never prefix-matched
    assert (
        grade(["test_calc.py::test_fmt"], [], case.run.log, case.run.exit_code).status
        is VerifyStatus.UNRESOLVED
    )


@pytest.mark.parametrize("case", _with(Finding.NO_SUMMARY), ids=_ids(_with(Finding.NO_SUMMARY)))
def test_a_log_without_a_summary_is_never_resolved(case: Case):
    assert "short test summary info" not in case.run.log and case.run.exit_code == 0
    g = grade(case.f2p, case.p2p, case.run.log, case.run.exit_code)
    assert g.status is VerifyStatus.INFRA_ERROR and g.state is LogState.INCOMPLETE
    assert all(
        t["outcome"] is PytestOutcome.PASSED for t in g.tests.values()
    )  # the -v lines alone say PASSED
    assert case.judge().status is VerifyStatus.UNRESOLVED


@pytest.mark.parametrize("case", _with(Finding.CRASH), ids=_ids(_with(Finding.CRASH)))
def test_a_crash_is_zero_when_the_unpatched_tree_runs_and_infra_when_it_does_not(case: Case):
    assert case.witness is not None
    assert grade(case.f2p, case.p2p, case.run.log, case.run.exit_code).state is LogState.INCOMPLETE
    witness_ok = (
        grade(case.f2p, case.p2p, case.witness.log, case.witness.exit_code).state is LogState.COMPLETE
    )
    g = case.judge()
    assert g.status is (VerifyStatus.UNRESOLVED if witness_ok else VerifyStatus.INFRA_ERROR), g.detail
    assert g.status is case.expected
    # the same crash when the unpatched tree crashes as well: the environment, never a 0
    broken = judge(case.f2p, case.p2p, case.run, lambda: case.run)
    assert broken.status is VerifyStatus.INFRA_ERROR and broken.reward is None
    assert "the environment" in broken.detail
    stopped = judge(case.f2p, case.p2p, case.run, lambda: PytestRun("", None, VerifyStatus.TIMEOUT))
    assert stopped.status is VerifyStatus.INFRA_ERROR


def test_the_witness_runs_only_for_an_abnormal_end():
    def no_witness() -> PytestRun:
        raise AssertionError("the witness must not run for a complete log")

    for case in CASES.values():
        if case.witness is None:
            judge(case.f2p, case.p2p, case.run, no_witness)


# -- defences that beat SWE-bench's own parser ---------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["forged_summary_at_exit", "exit_code_lies", "forged_verbose_line_live", "skip_reason_injection"]
)
def test_tampered_logs_are_infra_errors(name: str):
    g = CASES[name].judge()
    assert g.status is VerifyStatus.INFRA_ERROR and g.state is LogState.INCONSISTENT and g.reward is None
    assert CASES[name].difference  # documented in docs/verify.md


@pytest.mark.parametrize("name", ["captured_output_forgery", "forged_line_for_missing_id"])
def test_passed_lines_in_captured_output_count_for_nothing(name: str):
    case = CASES[name]
    assert "PASSED test_calc.py::test_" in case.run.log.split("short test summary info")[0]
    g = case.judge()
    assert g.status is VerifyStatus.UNRESOLVED and g.reward == 0.0


def test_ids_with_spaces_brackets_and_dashes_are_read_whole():
    case = CASES["param_ids_special"]
    assert case.judge().status is VerifyStatus.RESOLVED
    g = CASES["param_id_with_dash_fails"].judge()
    assert g.tests["test_calc.py::test_add[a - b]"]["outcome"] is PytestOutcome.FAILED
    assert [t for t, v in g.tests.items() if not v["ok"]] == ["test_calc.py::test_add[a - b]"]


# -- logs from a pytest run here, mutated --------------------------------------------------------------------
SUITE = """
import pytest

def test_pass(): pass
def test_fail(): assert 0
@pytest.mark.skip(reason="no")
def test_skip(): pass
@pytest.mark.xfail
def test_xfail(): assert 0
@pytest.mark.xfail
def test_xpass(): pass
@pytest.mark.parametrize("x", [1, 2])
def test_param(x): assert x == 1
@pytest.fixture
def broken():
    raise RuntimeError("setup")
def test_setup_error(broken): pass
"""


@pytest.fixture(scope="module")
def real_log(tmp_path_factory) -> tuple[str, int]:
    d = tmp_path_factory.mktemp("suite")
    (d / "test_suite.py").write_text(SUITE)
    args = [a.replace("/workspace", str(d)) for a in PYTEST_ARGS]
    p = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_suite.py"], cwd=d, capture_output=True, text=True
    )
    return p.stdout, p.returncode


def test_parse_real_log(real_log):
    log, code = real_log
    parsed = parse_pytest_log(log)
    assert code == 1 and parsed.inconsistent == [] and parsed.incomplete == []
    assert parsed.outcomes == {
        "test_suite.py::test_pass": "PASSED",
        "test_suite.py::test_fail": "FAILED",
        "test_suite.py::test_skip": "SKIPPED",
        "test_suite.py::test_xfail": "XFAIL",
        "test_suite.py::test_xpass": "XPASS",
        "test_suite.py::test_param[1]": "PASSED",
        "test_suite.py::test_param[2]": "FAILED",
        "test_suite.py::test_setup_error": "ERROR",
    }


@pytest.mark.parametrize(
    "f2p, p2p, resolved, fraction",
    [
        (["test_suite.py::test_pass"], ["test_suite.py::test_param[1]"], True, 1.0),
        (["test_suite.py::test_xfail"], ["test_suite.py::test_skip"], True, 1.0),  # XFAIL ok; skipped P2P ok
        (["test_suite.py::test_skip"], [], False, 0.0),  # a skipped F2P test fails
        (["test_suite.py::test_xpass"], [], False, 0.0),  # XPASS is not a SWE-bench status: absent
        (["test_suite.py::test_pass"], ["test_suite.py::test_xpass"], False, 1.0),
        (["test_suite.py::test_pass", "test_suite.py::test_gone"], [], False, 0.5),  # missing fails
        (["test_suite.py::test_pass"], ["test_suite.py::test_gone"], False, 1.0),  # missing P2P fails
        (["test_suite.py::test_pass"], ["test_suite.py::test_setup_error"], False, 1.0),
        (["test_suite.py::test_param[2]"], [], False, 0.0),
    ],
)
def test_swebench_rules(real_log, f2p, p2p, resolved, fraction):
    log, code = real_log
    g = grade(f2p, p2p, log, code)
    assert g.status == ("resolved" if resolved else "unresolved")
    assert g.resolved is resolved and g.reward == float(resolved) and g.f2p_fraction == fraction


def test_contradictions_and_abnormal_ends(real_log):
    log, _ = real_log
    g = grade(["test_suite.py::test_pass"], [], log, 0)  # exit 0 but failures in the log: tampering
    assert g.status == "infra_error" and g.state is LogState.INCONSISTENT and "exited 0" in g.detail
    passing = "\n".join(ln for ln in log.split("\n") if "FAILED" not in ln and "ERROR" not in ln)
    assert grade(["test_suite.py::test_pass"], [], passing, 1).state is LogState.INCONSISTENT  # counts differ
    for text, code in (("Segmentation fault\n", 139), ("", 4), (log, None)):
        g = grade(["a::b"], [], text, code)
        assert g.status == "infra_error" and g.state is LogState.INCOMPLETE and g.reward is None
    forged = log + "PASSED test_suite.py::test_fail\n"  # after the final line
    assert "after the session ended" in grade(["test_suite.py::test_fail"], [], forged, 1).detail
    body, summary = log.split("short test summary info", 1)
    flipped = body.replace("test_suite.py::test_fail FAILED", "test_suite.py::test_fail PASSED")
    g = grade(["test_suite.py::test_fail"], [], flipped + "short test summary info" + summary, 1)
    assert g.state is LogState.INCONSISTENT


def test_collection_error_counts_as_missing(tmp_path):
    (tmp_path / "test_c.py").write_text("import no_such_module\n\ndef test_a(): pass\n")
    args = [a.replace("/workspace", str(tmp_path)) for a in PYTEST_ARGS]
    p = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_c.py"], cwd=tmp_path, capture_output=True, text=True
    )
    g = grade(["test_c.py::test_a"], [], p.stdout, p.returncode)
    assert p.returncode == 2 and g.status == "unresolved"
    assert g.tests["test_c.py::test_a"]["outcome"] == "MISSING"


# -- the stored logs are what the installed pytest writes today ----------------------------------------------
FRESH = ["teardown_error_unlisted", "importorskip_only_module", "pytester_inner_runs", "segfault"]


@requires_bwrap
@pytest.mark.parametrize("name", FRESH)
def test_a_fresh_run_of_a_corpus_project_grades_the_same(name: str):
    from tests.verify.pytest_corpus.cases import specs
    from tests.verify.pytest_corpus.generate import run_tree

    spec = next(s for s in specs() if s.name == name)
    run, _ = run_tree(spec, spec.files)
    witness_files = {**spec.files, **(spec.witness or {})}
    g = judge(spec.f2p, spec.p2p, run, lambda: run_tree(spec, witness_files)[0])
    assert g.status is CASES[name].expected, g.detail
    assert run.exit_code == CASES[name].run.exit_code
