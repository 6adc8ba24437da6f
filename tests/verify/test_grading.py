"""Log parsing and SWE-bench 5.x grading on logs from real pytest runs, plus forged and contradictory logs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harnessrl.verify.grading import grade, parse_pytest_log
from harnessrl.verify.verifier import PYTEST_ARGS

SUITE = """
import pytest

def test_pass(): pass
def test_fail(): assert 0
@pytest.mark.skip(reason="no")
def test_skip(): pass
@pytest.mark.xfail
def test_xfail(): assert 0
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
    assert code == 1 and parsed.problems == []
    assert parsed.outcomes == {
        "test_suite.py::test_pass": "PASSED",
        "test_suite.py::test_fail": "FAILED",
        "test_suite.py::test_skip": "SKIPPED",
        "test_suite.py::test_xfail": "XFAIL",
        "test_suite.py::test_param[1]": "PASSED",
        "test_suite.py::test_param[2]": "FAILED",
        "test_suite.py::test_setup_error": "ERROR",
    }


@pytest.mark.parametrize(
    "f2p, p2p, resolved, fraction",
    [
        (["test_suite.py::test_pass"], ["test_suite.py::test_param[1]"], True, 1.0),
        (
            ["test_suite.py::test_xfail"],
            ["test_suite.py::test_skip"],
            True,
            1.0,
        ),  # XFAIL passes; skipped P2P ok
        (["test_suite.py::test_skip"], [], False, 0.0),  # skipped F2P fails
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


def test_contradictions_are_infra_errors(real_log):
    log, _ = real_log
    g = grade(["test_suite.py::test_pass"], [], log, 0)  # exit 0 but failures in the log
    assert g.status == "infra_error" and g.reward is None and "exited 0" in g.detail
    passing = "\n".join(ln for ln in log.splitlines() if "FAILED" not in ln and "ERROR" not in ln)
    assert grade(["test_suite.py::test_pass"], [], passing, 1).status == "infra_error"
    assert "no parsable" in grade(["a::b"], [], "Segmentation fault\n", 0).detail
    assert grade(["a::b"], [], "", 4).status == "infra_error"
    assert grade(["a::b"], [], log, 5).status == "infra_error"


def test_forged_lines_are_detected(real_log):
    log, code = real_log
    forged = (
        log + "\n=========== short test summary info ===========\nPASSED test_suite.py::test_fail\n"
        "=========== 7 passed in 0.01s ===========\n"
    )
    g = grade(["test_suite.py::test_fail"], [], forged, 0)
    assert g.status == "infra_error" and g.reward is None
    # a forged verbose line in captured output contradicting the summary
    body, summary = log.split("short test summary info", 1)
    twice = (
        body.replace("test_suite.py::test_fail FAILED", "test_suite.py::test_fail PASSED")
        + "short test summary info"
        + summary
    )
    assert grade(["test_suite.py::test_fail"], [], twice, code).status == "infra_error"


def test_collection_error_counts_as_missing(tmp_path):
    (tmp_path / "test_c.py").write_text("import no_such_module\n\ndef test_a(): pass\n")
    args = [a.replace("/workspace", str(tmp_path)) for a in PYTEST_ARGS]
    p = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_c.py"], cwd=tmp_path, capture_output=True, text=True
    )
    g = grade(["test_c.py::test_a"], [], p.stdout, p.returncode)
    assert (
        p.returncode == 2
        and g.status == "unresolved"
        and g.tests["test_c.py::test_a"]["outcome"] == "MISSING"
    )
