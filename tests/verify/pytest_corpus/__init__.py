"""The grading corpus: real pytest runs with verify's command line, each with SWE-bench 5.x's verdict.

    load_cases() -> list[Case]; Case.judge() -> Grade (verify's grading, witness included)

Regenerate with `.venv/bin/python -m tests.verify.pytest_corpus.generate` (see generate.py).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from harnessrl.verify.grading import Grade, PytestRun, VerifyStatus, judge
from tests.verify.pytest_corpus.cases import Finding

HERE = Path(__file__).resolve().parent
INDEX = HERE / "cases.json"


def _run(record: dict, name: str) -> PytestRun:
    path = HERE / record["log"]
    if not path.is_file():
        raise FileNotFoundError(f"{INDEX}: case {name!r}: log {path} is missing; regenerate the corpus")
    data = path.read_bytes()
    log = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "surrogateescape")
    stopped = VerifyStatus(record["stopped"]) if record["stopped"] else None
    return PytestRun(log, record["exit_code"], stopped)


@dataclass(frozen=True)
class Case:
    name: str
    f2p: list[str]
    p2p: list[str]
    run: PytestRun
    witness: PytestRun | None
    swebench: VerifyStatus  # RESOLVED / UNRESOLVED under SWE-bench 5.x's rules
    reason: str
    expected: VerifyStatus  # verify's verdict: SWE-bench's, or a documented deliberate difference
    difference: str
    findings: tuple[Finding, ...]

    def judge(self) -> Grade:
        def witness() -> PytestRun:
            if self.witness is None:
                raise AssertionError(f"case {self.name!r} needs a witness run but the corpus has none")
            return self.witness

        return judge(self.f2p, self.p2p, self.run, witness)

    def agrees(self, status: VerifyStatus) -> bool:
        """Graded as SWE-bench 5.x grades it (reward 1 vs 0), or exactly as a documented difference says."""
        if self.difference:
            return status is self.expected
        zero = status not in (VerifyStatus.RESOLVED, VerifyStatus.INFRA_ERROR)
        return status is VerifyStatus.RESOLVED if self.swebench is VerifyStatus.RESOLVED else zero


def load_cases() -> list[Case]:
    cases = []
    for c in json.loads(INDEX.read_text())["cases"]:
        cases.append(
            Case(
                name=c["name"],
                f2p=c["f2p"],
                p2p=c["p2p"],
                run=_run(c["run"], c["name"]),
                witness=_run(c["witness"], c["name"]) if c["witness"] else None,
                swebench=VerifyStatus(c["swebench"]),
                reason=c["reason"],
                expected=VerifyStatus(c["expected"]),
                difference=c["difference"],
                findings=tuple(Finding(f) for f in c["findings"]),
            )
        )
    return cases


def corpus_info() -> dict:
    """pytest and Python versions the corpus was generated with, and verify's command line."""
    return {k: v for k, v in json.loads(INDEX.read_text()).items() if k != "cases"}
