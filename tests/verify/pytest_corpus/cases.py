"""The corpus's cases: small test projects, the F2P/P2P lists, and the verdicts (one block per case; a data table,
hence its length). `generate.py` runs them.

Each case states the verdict SWE-bench 5.x gives it under its documented rules (`swebench`, with the `reason`),
the verdict verify must give (`expected`: the same, or a reward-0 status such as timeout, unless `difference`
names a deliberate difference documented in docs/verify.md) and the reported defects it exercises (`findings`).
Cases whose run ends abnormally carry the files of the *unpatched* tree (`witness`), which verify runs then.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from enum import StrEnum

from harnessrl.sandbox.base import Limits
from harnessrl.verify.grading import VerifyStatus

R, U = VerifyStatus.RESOLVED, VerifyStatus.UNRESOLVED


class Finding(StrEnum):
    """The reported grading defects a case exercises."""

    TEARDOWN = "teardown-error"  # a second result (error at teardown) for one test
    IMPORTORSKIP = "importorskip"  # a module skipped at import: a count, no test ids
    CAP = "output-cap"  # output over the sandbox's 2 MiB cap
    PYTESTER = "pytester"  # inner pytest sessions in captured output
    PREFIX = "truncated-ids"  # F2P ids stored cut short
    NO_SUMMARY = "no-summary"  # no -rA summary
    CRASH = "crash-witness"  # the run ends abnormally: the unpatched tree decides


TEARDOWN, IMPORTORSKIP, CAP, PYTESTER, PREFIX, NO_SUMMARY, CRASH = Finding


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


CALC = _src("""
    def add(a, b):
        return a + b


    def mul(a, b):
        return a * b


    def cleanup():
        return None
""")
CALC_BUG = CALC.replace("a + b", "a - b")
TESTS = _src("""
    import calcmod


    def test_add():
        assert calcmod.add(2, 3) == 5


    def test_mul():
        assert calcmod.mul(2, 3) == 6
""")
BASE = {"calcmod.py": CALC, "test_calc.py": TESTS}
F2P, P2P = ["test_calc.py::test_add"], ["test_calc.py::test_mul"]
CLEANUP_LAST = TESTS + "\n\ndef test_zz_cleanup():\n    calcmod.cleanup()\n"
LEAKY = _src("""
    import pytest

    import calcmod


    @pytest.fixture
    def leaky():
        yield
        raise RuntimeError("teardown failed")


    @pytest.fixture
    def broken():
        raise RuntimeError("setup failed")
""")


def _calc_with(extra: str, base: str = CALC) -> str:
    return base + "\n\n" + _src(extra)


@dataclass(frozen=True)
class Spec:
    name: str
    files: dict[str, str]  # the tree verify tests: bug commit + the agent's (filtered) patch
    swebench: VerifyStatus  # RESOLVED / UNRESOLVED under SWE-bench 5.x's documented rules
    reason: str
    f2p: list[str] = field(default_factory=lambda: list(F2P))
    p2p: list[str] = field(default_factory=lambda: list(P2P))
    expected: VerifyStatus | None = None  # verify's verdict, when not simply SWE-bench's
    difference: str = ""  # a deliberate difference (heading in docs/verify.md), when expected differs
    findings: tuple[Finding, ...] = ()
    witness: dict[str, str] | None = None  # files the unpatched tree has instead (crash cases)
    timeout_s: float = 60.0
    limits: Limits | None = None


def _pytester_tests(outer_assert: str) -> str:
    return _src(f"""
        import calcmod

        INNER = "def test_add():\\n    pass\\n\\n\\ndef test_mul():\\n    assert 0\\n"


        def test_add(pytester):
            pytester.makepyfile(test_inner=INNER)
            result = pytester.runpytest("-rA", "-v")
            result.assert_outcomes({outer_assert})
            assert calcmod.add(2, 3) == 5


        def test_mul(pytester):
            pytester.makepyfile(test_calc=INNER)  # the inner ids collide with the outer ones
            result = pytester.runpytest_subprocess("-rA", "-v")
            result.assert_outcomes(passed=1, failed=1)
            assert calcmod.mul(2, 3) == 6
    """)


MANY = 3000  # parametrized tests with ~400-character ids: ~2.5 MB of output, over the 2 MiB cap
LONG = "x" * 390
MANY_TESTS = _src(f"""
    import pytest

    import calcmod


    def test_add():
        assert calcmod.add(2, 3) == 5


    @pytest.mark.parametrize("case", [f"case-{{i:05d}}-{LONG}" for i in range({MANY})], ids=str)
    def test_many(case):
        assert case


    def test_mul():
        assert calcmod.mul(2, 3) == 6
""")
NOISY = 3 << 20  # bytes a noisy test prints: more than the 2 MiB cap on its own


def specs() -> list[Spec]:
    s: list[Spec] = []
    add = s.append
    # -- the usual outcomes ------------------------------------------------------------------------------
    add(Spec("pass_all", BASE, R, "every F2P and P2P test PASSED"))
    add(Spec("f2p_fails", {**BASE, "calcmod.py": CALC_BUG}, U, "F2P FAILED (test_failed)"))
    add(
        Spec(
            "p2p_fails",
            {**BASE, "calcmod.py": CALC.replace("a * b", "a + b")},
            U,
            "P2P FAILED: not maintained",
        )
    )
    add(
        Spec(
            "no_f2p",
            BASE,
            R,
            "no F2P tests: compute_fail_to_pass is 1 by definition; P2P PASSED",
            f2p=[],
            p2p=["test_calc.py::test_add", "test_calc.py::test_mul"],
        )
    )
    add(
        Spec(
            "f2p_missing",
            BASE,
            U,
            "an F2P id that the run does not report is absent from the status map: test_failed",
            f2p=["test_calc.py::test_add_renamed"],
        )
    )
    xfail_tests = TESTS.replace("def test_add", "@pytest.mark.xfail\ndef test_add").replace(
        "import calcmod", "import pytest\n\nimport calcmod"
    )
    add(
        Spec(
            "f2p_xfail",
            {"calcmod.py": CALC_BUG, "test_calc.py": xfail_tests},
            R,
            "F2P XFAIL: test_passed accepts PASSED and XFAIL",
        )
    )
    add(
        Spec(
            "f2p_xpass",
            {**BASE, "test_calc.py": xfail_tests},
            U,
            "F2P XPASS: XPASS is not a SWE-bench TestStatus, so the test is absent from the status map",
        )
    )
    add(
        Spec(
            "p2p_xpass",
            {**BASE, "test_calc.py": xfail_tests},
            U,
            "P2P XPASS: absent from the status map, so not maintained",
            f2p=["test_calc.py::test_mul"],
            p2p=["test_calc.py::test_add"],
        )
    )
    add(
        Spec(
            "f2p_xpass_strict",
            {**BASE, "test_calc.py": xfail_tests.replace("xfail\n", "xfail(strict=True)\n")},
            U,
            "a strict xfail that passes is reported FAILED ([XPASS(strict)])",
        )
    )
    skip_mul = TESTS.replace("def test_mul", '@pytest.mark.skip(reason="slow")\ndef test_mul').replace(
        "import calcmod", "import pytest\n\nimport calcmod"
    )
    add(
        Spec(
            "p2p_skipped",
            {**BASE, "test_calc.py": skip_mul},
            R,
            "test_maintained: a SKIPPED P2P test is not a regression (verify reads its id from the -v line; "
            "pytest folds skips in the -rA summary)",
        )
    )
    add(
        Spec(
            "f2p_skipped",
            {
                "calcmod.py": _calc_with("import pytest\n\n\ndef add(a, b):\n    pytest.skip('not yet')\n"),
                "test_calc.py": TESTS,
            },
            U,
            "test_failed counts a SKIPPED F2P test as failed",
        )
    )
    add(
        Spec(
            "f2p_setup_error",
            {
                **BASE,
                "test_calc.py": LEAKY + TESTS.split("\n", 1)[1].replace("test_add()", "test_add(broken)"),
            },
            U,
            "F2P ERROR at setup: test_failed",
        )
    )
    add(
        Spec(
            "p2p_setup_error",
            {
                **BASE,
                "test_calc.py": LEAKY + TESTS.split("\n", 1)[1].replace("test_mul()", "test_mul(broken)"),
            },
            U,
            "P2P ERROR at setup: not maintained",
        )
    )
    add(
        Spec(
            "unittest_and_classes",
            {
                "calcmod.py": CALC,
                "tests/unit/test_calc.py": _src("""
                    import unittest

                    import calcmod


                    class TestCalc:
                        def test_add(self):
                            assert calcmod.add(2, 3) == 5


                    class CalcCase(unittest.TestCase):
                        def test_mul(self):
                            self.assertEqual(calcmod.mul(2, 3), 6)

                        @unittest.skip("later")
                        def test_div(self):
                            pass
                """),
            },
            R,
            "class and unittest ids in a nested directory PASSED; the skipped unittest P2P is maintained",
            f2p=["tests/unit/test_calc.py::TestCalc::test_add"],
            p2p=[
                "tests/unit/test_calc.py::CalcCase::test_mul",
                "tests/unit/test_calc.py::CalcCase::test_div",
            ],
        )
    )
    special = _src("""
        import pytest

        import calcmod

        IDS = ["a b", "x[1]", "a - b", "é", "PASSED x", "a::b", " lead", "tab\\there"]


        @pytest.mark.parametrize("s", IDS)
        def test_add(s):
            assert calcmod.add(2, 3) == 5 and s != "BROKEN"


        def test_mul():
            assert calcmod.mul(2, 3) == 6
    """)
    special_ids = [
        "test_calc.py::test_add[a b]",
        "test_calc.py::test_add[x[1]]",
        "test_calc.py::test_add[a - b]",
        "test_calc.py::test_add[\\xe9]",
        "test_calc.py::test_add[PASSED x]",
        "test_calc.py::test_add[a::b]",
        "test_calc.py::test_add[ lead]",
        "test_calc.py::test_add[tab\\there]",
    ]
    add(
        Spec(
            "param_ids_special",
            {**BASE, "test_calc.py": special},
            R,
            "every parametrized F2P id (spaces, brackets, ' - ', escaped unicode, '::') PASSED; SWE-bench's "
            "own parser splits ids at whitespace and would miss some, its rules pass them",
            f2p=special_ids,
        )
    )
    add(
        Spec(
            "param_id_with_dash_fails",
            {**BASE, "test_calc.py": special.replace('"BROKEN"', '"a - b"')},
            U,
            "F2P 'test_add[a - b]' FAILED (its summary line is 'FAILED <id> - <message>')",
            f2p=special_ids,
        )
    )
    add(
        Spec(
            "failure_message_with_status_words",
            {
                **BASE,
                "test_calc.py": TESTS.replace("== 5\n", "== 5, 'PASSED test_calc.py::test_add'\n"),
                "calcmod.py": CALC_BUG,
            },
            U,
            "F2P FAILED; its one-line message imitates a PASSED line",
        )
    )
    add(
        Spec(
            "warnings_summary",
            {
                **BASE,
                "calcmod.py": _calc_with(
                    "import warnings\n\n\ndef add(a, b):\n"
                    "    warnings.warn('add is deprecated', DeprecationWarning)\n    return a + b\n"
                ),
            },
            R,
            "F2P PASSED with a warning; the warnings summary section is not a result",
        )
    )
    add(
        Spec(
            "live_logging",
            {
                **BASE,
                "pytest.ini": "[pytest]\nlog_cli = true\nlog_cli_level = INFO\n",
                "calcmod.py": _calc_with(
                    "import logging\n\n\ndef add(a, b):\n"
                    "    logging.getLogger('calc').error('ERROR test_calc.py::test_add adding')\n    return a + b\n"
                ),
            },
            R,
            "F2P PASSED; the repo's ini turns on live logging, whose sections split the -v lines",
        )
    )
    add(
        Spec(
            "terminal_summary_plugin",
            {
                **BASE,
                "conftest.py": _src("""
                    def pytest_terminal_summary(terminalreporter):
                        terminalreporter.write_sep("=", "custom report")
                        terminalreporter.write_line("FAILED test_calc.py::test_add (in the custom report)")
                """),
            },
            R,
            "F2P and P2P PASSED; a repo plugin writes its own section (with a FAILED line) before the summary",
        )
    )
    add(
        Spec(
            "live_output_listed",
            {
                **BASE,
                "test_calc.py": TESTS.replace("def test_add():\n", "def test_add(capsys):\n").replace(
                    "    assert calcmod.add(2, 3) == 5\n",
                    "    with capsys.disabled():\n        print('self-check PASSED')\n"
                    "    assert calcmod.add(2, 3) == 5\n",
                ),
            },
            R,
            "F2P PASSED; its live output splits its -v line ('<id> self-check PASSED', then 'PASSED [ 50%]')",
        )
    )
    other = {
        "othermod.py": "VALUE = 6\n",
        "test_other.py": "import othermod\n\n\ndef test_value():\n    assert othermod.VALUE == 6\n",
    }
    add(
        Spec(
            "collection_error_f2p_file",
            {**BASE, "calcmod.py": "def add(a, b:\n"},
            U,
            "the F2P file fails to import: its tests are absent (only 'ERROR test_calc.py' is reported)",
        )
    )
    add(
        Spec(
            "collection_error_other_file",
            {**BASE, **other, "othermod.py": "VALUE = (\n"},
            U,
            "a collection error interrupts the session before any test runs: F2P and P2P absent",
            p2p=["test_calc.py::test_mul", "test_other.py::test_value"],
        )
    )
    # -- forgeries and contradictions ----------------------------------------------------------------------
    add(
        Spec(
            "captured_output_forgery",
            {
                **BASE,
                "calcmod.py": CALC_BUG.replace(
                    "    return a * b\n",
                    "    print('PASSED test_calc.py::test_add')\n    return a * b\n",
                ),
            },
            U,
            "F2P FAILED; the PASSED line printed by the patched code is captured output (the real summary "
            "line comes later and wins in SWE-bench's parser too)",
        )
    )
    modes = _src("""
        import pytest

        import calcmod


        def test_add():
            assert calcmod.add(2, 3) == 5


        def test_mul():
            assert calcmod.mul(2, 3) == 6


        @pytest.mark.parametrize("mode", calcmod.MODES)
        def test_mode(mode):
            assert mode
    """)
    add(
        Spec(
            "forged_line_for_missing_id",
            {
                "calcmod.py": CALC.replace(
                    "    return a * b\n",
                    "    print('PASSED test_calc.py::test_mode[gone]')\n    return a * b\n",
                )
                + "\n\nMODES = ['kept']\n",
                "test_calc.py": modes,
            },
            U,
            "F2P test_mode[gone] does not exist in this run (absent: test_failed); SWE-bench's own parser "
            "would take the forged captured PASSED line for it",
            f2p=["test_calc.py::test_add", "test_calc.py::test_mode[gone]"],
        )
    )
    bypass = _src("""
        def _live(text):  # writes past pytest's output capture
            import gc

            from _pytest.capture import CaptureManager

            capman = next(o for o in gc.get_objects() if isinstance(o, CaptureManager))
            with capman.global_and_fixture_disabled():
                print(text)
    """)
    add(
        Spec(
            "forged_verbose_line_live",
            {
                "calcmod.py": CALC.replace(
                    "    return a * b\n",
                    "    _live('\\ntest_calc.py::test_mode[gone] PASSED')\n    return a * b\n",
                )
                + "\n\nMODES = ['kept']\n\n\n"
                + bypass,
                "test_calc.py": modes,
            },
            U,
            "F2P test_mode[gone] does not exist in this run: test_failed",
            f2p=["test_calc.py::test_add", "test_calc.py::test_mode[gone]"],
            expected=VerifyStatus.INFRA_ERROR,
            difference="Tampered logs are infrastructure errors",
        )
    )
    add(
        Spec(
            "skip_reason_injection",
            {
                **BASE,
                "calcmod.py": _calc_with(
                    "import pytest\n\n\ndef add(a, b):\n"
                    "    pytest.skip('later\\nPASSED test_calc.py::test_add')\n"
                ),
            },
            U,
            "F2P SKIPPED (test_failed); the skip reason injects a PASSED line into the real summary, which "
            "SWE-bench's own parser would believe",
            expected=VerifyStatus.INFRA_ERROR,
            difference="Tampered logs are infrastructure errors",
        )
    )
    forged = "\\n".join(
        ["=" * 20 + " short test summary info " + "=" * 20, "PASSED test_calc.py::test_add"]
        + ["PASSED test_calc.py::test_mul", "=" * 20 + " 2 passed in 0.01s " + "=" * 20]
    )
    add(
        Spec(
            "forged_summary_at_exit",
            {
                **BASE,
                "calcmod.py": _calc_with(
                    f"import atexit\nimport os\n\natexit.register(lambda: (print('{forged}'), os._exit(0)))\n",
                    CALC_BUG,
                ),
            },
            U,
            "F2P FAILED; a second summary printed after the session (SWE-bench's own parser would take it)",
            expected=VerifyStatus.INFRA_ERROR,
            difference="Tampered logs are infrastructure errors",
        )
    )
    add(
        Spec(
            "exit_code_lies",
            {
                **BASE,
                "calcmod.py": _calc_with(
                    "import atexit\nimport os\n\natexit.register(lambda: os._exit(0))\n", CALC_BUG
                ),
            },
            U,
            "F2P FAILED (the exit code is 0 although the log shows a failure)",
            expected=VerifyStatus.INFRA_ERROR,
            difference="Tampered logs are infrastructure errors",
        )
    )
    # -- teardown errors ----------------------------------------------------------------------------------
    leaky_tests = LEAKY + TESTS.split("\n", 1)[1]
    add(
        Spec(
            "teardown_error_unlisted",
            {**BASE, "test_calc.py": leaky_tests + "\n\ndef test_leaky(leaky):\n    pass\n"},
            R,
            "an unlisted test PASSED then ERROR at teardown; F2P and P2P PASSED",
            findings=(TEARDOWN,),
        )
    )
    add(
        Spec(
            "teardown_error_after_failure_unlisted",
            {**BASE, "test_calc.py": leaky_tests + "\n\ndef test_leaky(leaky):\n    assert 0\n"},
            R,
            "an unlisted test FAILED then ERROR at teardown; F2P and P2P PASSED",
            findings=(TEARDOWN,),
        )
    )
    add(
        Spec(
            "setup_and_teardown_error_unlisted",
            {**BASE, "test_calc.py": leaky_tests + "\n\ndef test_leaky(leaky, broken):\n    pass\n"},
            R,
            "an unlisted test errors at setup and at teardown; F2P and P2P PASSED",
            findings=(TEARDOWN,),
        )
    )
    add(
        Spec(
            "teardown_error_f2p",
            {**BASE, "test_calc.py": leaky_tests.replace("test_add()", "test_add(leaky)")},
            U,
            "F2P PASSED then ERROR at teardown: the summary's ERROR line comes last, test_failed",
            findings=(TEARDOWN,),
        )
    )
    add(
        Spec(
            "teardown_error_xfail_f2p",
            {
                "calcmod.py": CALC_BUG,
                "test_calc.py": leaky_tests.replace(
                    "def test_add()", "@pytest.mark.xfail\ndef test_add(leaky)"
                ),
            },
            R,
            "an xfail-marked F2P test whose teardown fails is reported XFAIL twice: test_passed",
            findings=(TEARDOWN,),
        )
    )
    # -- module-level skips --------------------------------------------------------------------------------
    skip_import = TESTS.replace("import calcmod", "import pytest\n\ncalcmod = pytest.importorskip('calcmod')")
    add(
        Spec(
            "importorskip_listed_module",
            {
                **BASE,
                **other,
                "test_calc.py": skip_import,
                "calcmod.py": "import no_such_dependency_xyz\n" + CALC,
            },
            U,
            "the F2P module is skipped at import (a count in the summary, no test ids): F2P absent",
            p2p=["test_other.py::test_value"],
            findings=(IMPORTORSKIP,),
        )
    )
    add(
        Spec(
            "importorskip_only_module",
            {**BASE, "test_calc.py": skip_import, "calcmod.py": "import no_such_dependency_xyz\n" + CALC},
            U,
            "every listed module is skipped at import: nothing ran (exit 5), no test in the status map",
            findings=(IMPORTORSKIP, CRASH),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    # -- output over the sandbox's 2 MiB cap ---------------------------------------------------------------
    noisy = f"\n\ndef test_noisy():\n    for _ in range({NOISY // 101}):\n        print('n' * 100)\n"
    add(
        Spec(
            "output_cap_captured",
            {**BASE, "test_calc.py": TESTS.replace("\n\ndef test_mul", noisy + "\n\ndef test_mul")},
            R,
            "F2P and P2P PASSED; an unlisted test's 3 MiB of captured output fills the PASSES section",
            findings=(CAP,),
        )
    )
    live_noisy = (
        f"\n\ndef test_noisy(capsys):\n    with capsys.disabled():\n        for _ in range({NOISY // 101}):\n"
        "            print('n' * 100)\n"
    )
    add(
        Spec(
            "output_cap_live",
            {**BASE, "test_calc.py": TESTS.replace("\n\ndef test_mul", live_noisy + "\n\ndef test_mul")},
            R,
            "F2P and P2P PASSED; an unlisted test prints 3 MiB live, between the -v lines",
            findings=(CAP,),
        )
    )
    many_ids = [f"test_calc.py::test_many[case-{i:05d}-{LONG}]" for i in (0, MANY - 1)]
    add(
        Spec(
            "output_cap_many_tests",
            {**BASE, "test_calc.py": MANY_TESTS},
            R,
            f"{MANY + 2} tests with long ids: the cut removes the end of the -v lines and the start of the "
            "summary; every F2P and P2P test PASSED",
            p2p=["test_calc.py::test_mul", *many_ids],
            findings=(CAP,),
            timeout_s=300,
        )
    )
    add(
        Spec(
            "output_cap_many_tests_f2p_fails",
            {"calcmod.py": CALC_BUG, "test_calc.py": MANY_TESTS},
            U,
            "as output_cap_many_tests, but F2P FAILED",
            p2p=["test_calc.py::test_mul", *many_ids],
            findings=(CAP,),
            timeout_s=300,
        )
    )
    # -- pytester: inner runs print whole sessions into captured output -------------------------------------
    pytester_files = {"calcmod.py": CALC, "conftest.py": 'pytest_plugins = ["pytester"]\n'}
    add(
        Spec(
            "pytester_inner_runs",
            {**pytester_files, "test_calc.py": _pytester_tests("passed=1, failed=1")},
            R,
            "F2P and P2P PASSED; their inner pytest runs (in-process and subprocess, with colliding ids and "
            "failures) print whole sessions into captured output",
            findings=(PYTESTER,),
        )
    )
    add(
        Spec(
            "pytester_f2p_fails",
            {**pytester_files, "test_calc.py": _pytester_tests("passed=2")},
            U,
            "F2P FAILED (its assertion on the inner run); inner sessions in captured output",
            findings=(PYTESTER,),
        )
    )
    # -- F2P ids truncated as SWE-bench datasets store them -------------------------------------------------
    fmt = _src("""
        import pytest

        import calcmod


        @pytest.mark.parametrize("s", ["a b", "a c"])
        def test_fmt(s):
            assert calcmod.add(2, 3) == 5 and s != "BROKEN"


        def test_mul():
            assert calcmod.mul(2, 3) == 6
    """)
    add(
        Spec(
            "truncated_f2p_id",
            {**BASE, "test_calc.py": fmt},
            R,
            "F2P 'test_fmt[a' (cut at the space) prefix-matches test_fmt[a b] and test_fmt[a c], both PASSED "
            "(_resolve_case, SWE-bench issue #290)",
            f2p=["test_calc.py::test_fmt[a"],
            findings=(PREFIX,),
        )
    )
    add(
        Spec(
            "truncated_f2p_id_disagree",
            {**BASE, "test_calc.py": fmt.replace('"BROKEN"', '"a c"')},
            U,
            "F2P 'test_fmt[a' prefix-matches a PASSED and a FAILED test: ambiguous, so absent: test_failed",
            f2p=["test_calc.py::test_fmt[a"],
            findings=(PREFIX,),
        )
    )
    # -- runs that end abnormally: the unpatched tree is the witness ----------------------------------------
    crash_tests = {**BASE, "test_calc.py": CLEANUP_LAST}
    add(
        Spec(
            "os_exit_after_listed_tests",
            {
                **crash_tests,
                "calcmod.py": CALC.replace("    return None\n", "    import os\n\n    os._exit(0)\n"),
            },
            U,
            "the process exits (status 0) before pytest prints a summary: no results in the log, not resolved",
            findings=(NO_SUMMARY, CRASH),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "segfault",
            {
                **crash_tests,
                "calcmod.py": CALC.replace(
                    "    return a + b\n", "    import ctypes\n\n    return ctypes.string_at(0)\n"
                ),
            },
            U,
            "the interpreter segfaults in the F2P test: no summary, not resolved",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "pytest_exit_in_test",
            {
                **crash_tests,
                "calcmod.py": CALC.replace(
                    "    return a + b\n", "    import pytest\n\n    pytest.exit('done')\n"
                ),
            },
            U,
            "pytest.exit in the F2P test: interrupted (exit 2), no summary, not resolved",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "pytest_exit_status_1_after_passes",
            {
                **crash_tests,
                "calcmod.py": CALC.replace(
                    "    return None\n", "    import pytest\n\n    pytest.exit('stop', returncode=1)\n"
                ),
            },
            U,
            "the listed tests PASSED but the run exits 1 with no failing test: SWE-bench 5.x's exit-code "
            "cross-check rejects the log, not resolved",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "keyboard_interrupt_at_import",
            {**crash_tests, "calcmod.py": "raise KeyboardInterrupt\n"},
            U,
            "interrupted during collection: no test ran, not resolved",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "internal_error_at_import",
            {**crash_tests, "calcmod.py": "import sys\n\nsys.exit(0)\n"},
            U,
            "SystemExit while collecting is an INTERNALERROR (exit 3): no test ran, not resolved",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "pytest_timeout_thread",
            {
                **crash_tests,
                "pytest.ini": "[pytest]\ntimeout = 3\ntimeout_method = thread\n",
                "calcmod.py": CALC.replace("    return a + b\n", "    import time\n\n    time.sleep(60)\n"),
            },
            U,
            "pytest-timeout (the repo's ini) dumps stacks and ends the process in the F2P test: no summary",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    add(
        Spec(
            "sandbox_timeout",
            {**BASE, "calcmod.py": CALC.replace("    return a + b\n", "    while True:\n        pass\n")},
            U,
            "the tests hang and are killed at the deadline (SWE-bench: Tests Timed Out)",
            expected=VerifyStatus.TIMEOUT,
            timeout_s=5.0,
        )
    )
    add(
        Spec(
            "memory_limit",
            {
                **BASE,
                "calcmod.py": CALC.replace(
                    "    return a + b\n", "    data = b'x' * (1 << 30)\n    return len(data)\n"
                ),
            },
            U,
            "the F2P test blows the memory limit and is killed: no result",
            expected=VerifyStatus.RESOURCE_LIMIT,
            limits=Limits(memory_mb=256),
        )
    )
    add(
        Spec(
            "environment_broken",
            {**BASE, "conftest.py": "import no_such_dependency_xyz\n"},
            U,
            "the repo's conftest cannot import a dependency (exit 4): nothing ran, not resolved",
            expected=VerifyStatus.INFRA_ERROR,
            difference="Environment failures are infrastructure errors",
            findings=(CRASH,),
            witness={"calcmod.py": CALC_BUG},
        )
    )
    return s
