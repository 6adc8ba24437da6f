"""Host side of kernel grading: builds the grading directory, runs grade.py in a sandbox, reads its result.

    kernel_env(cache=None) -> Path                                  the sandbox's Python: stdlib + numpy only
    prepare_workspace(task, dest) -> Path                           what the agent starts from
    grade_solution(task, source, *, seed=None, quick=False, ...) -> GradeReport
    grade_workspace(task, workspace, **kw) -> GradeReport           grades workspace/solution.py only
    GraderSettings(...).argv(timing_size) -> list[str]              the command run inside the sandbox

Invariants:
- The grading directory is new for every grade and holds exactly the candidate's `solution.py` (its text, as
  given), a pristine copy of the task's `reference.py`, `inputs.py`, `task.json` (from the task folder, never
  the agent's workspace), `grade.py`, and `.seed`: `{"seed", "nonce"}` that grade.py reads and deletes before
  any candidate code runs. `gold.py` never enters it. (`extra_files`, for tests, are written first, so the
  pristine copies overwrite any of the same name.)
- The sandbox's Python is a `--without-pip` venv whose only path entry beyond the stdlib is the host's
  site-packages directory with **only** numpy (and its bundled libraries) bound into it, read-only: nothing
  else of the host, harnessrl included, is importable or readable inside (`kernel_env`).
- The result is the one stdout line carrying this grade's nonce. No such line: the sandbox broke
  (`sandbox_error`, reward None: infrastructure) or the grader was stopped or killed before it could print —
  only candidate code can do that, since every candidate call has its own timeout — so `no_result`, reward
  0.0. A grader that caught an error of its own reports `internal_error`: reward None.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.environments.kernel.tasks import PRISTINE_FILES, KernelTask
from harnessrl.sandbox import leftovers
from harnessrl.sandbox.backends import make_sandbox
from harnessrl.sandbox.base import WORKSPACE_MOUNT, Limits, Outcome
from harnessrl.sandbox.bwrap import ENV_MANIFEST  # the paths it lists are bound read-only
from harnessrl.sandbox.envs import cached_venv
from harnessrl.schema import SandboxKind

log = logging.getLogger(__name__)

GRADE_SCRIPT = Path(__file__).with_name("grade.py")
SEED_FILE = ".seed"
# Generous on purpose: grade.py bounds every candidate call itself; this only catches a stopped grader.
DEFAULT_TIMEOUT_S = 300.0
GRADE_LIMITS = Limits(
    memory_mb=2048, processes=64, cpu_s=600, tmp_mb=256, workspace_mb=64, workspace_files=2000
)


class RunStatus(enum.StrEnum):
    """How the sandboxed grader run ended, seen from the host (grade.py's own `status` is separate)."""

    GRADED = "graded"  # the nonce line came back
    NO_RESULT = "no_result"  # no nonce line: the grader was stopped or killed (candidate code): reward 0
    SANDBOX_ERROR = "sandbox_error"  # the sandbox could not run: infrastructure, reward None
    INTERNAL_ERROR = "internal_error"  # grade.py reported an error of its own: infrastructure, reward None


@dataclass(frozen=True)
class GradeReport:
    task: str
    run_status: RunStatus
    status: (
        str  # grade.py's status (correct, incorrect, import_error, syntax_error, missing, ...) or run_status
    )
    reward: float | None  # None: infrastructure failure, never the candidate's
    syntax_ok: bool = False
    imports_ok: bool = False
    tests_passed: int = 0
    tests_total: int = 0
    speedup: float = 0.0
    candidate_s: float | None = None
    reference_s: float | None = None
    noisy: bool = False
    sandbox_wall_s: float = 0.0  # the whole sandboxed run, as the host measured it
    detail: str = ""
    raw: dict[str, Any] = field(default_factory=dict)  # grade.py's JSON line as printed

    @property
    def pass_rate(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0


def kernel_env(cache: Path | None = None) -> Path:
    """The venv the grader and candidate run with: stdlib + numpy, created once (sandbox.envs.cached_venv;
    `cache`: the folder it goes in, default `<cache>/envs`)."""
    import numpy  # the host's numpy is what the sandbox gets

    numpy_dir = Path(numpy.__file__).resolve().parent
    site = numpy_dir.parent
    key = hashlib.sha256(f"{sys.version}\0{numpy_dir}\0{numpy.__version__}".encode()).hexdigest()[:12]

    def fill(env: Path) -> None:
        env_site = next(env.glob("lib/python*/site-packages"))
        (env_site / "00-harnessrl-numpy.pth").write_text(f"{site}\n")
        bound = [p for p in site.iterdir() if p.name == "numpy.libs" or p.name.startswith("numpy-")]
        manifest = {"ro_paths": [str(numpy_dir), *(str(p) for p in sorted(bound))]}
        (env / ENV_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        log.info("kernel grading env at %s (numpy %s only)", env, numpy.__version__)

    return cached_venv(f"kernel-numpy-{key}", fill, cache)


def prepare_workspace(task: KernelTask, dest: Path) -> Path:
    """The agent's workspace: solution.py (to edit), reference.py and inputs.py (to read and test against),
    TASK.md (the statement). Everything here is the agent's; the grader trusts none of it."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("reference.py", "inputs.py"):
        shutil.copyfile(task.path(name), dest / name)
    shutil.copyfile(task.path("reference.py"), dest / "solution.py")  # the agent starts from the reference
    (dest / "TASK.md").write_text(
        f"# {task.name} (difficulty {task.difficulty})\n\n{task.statement}\n\n"
        f"Edit `solution.py`; keep the function `{task.function}` and its signature. `reference.py` is the "
        "correct slow version; `inputs.py` makes inputs like the grader's (`generate(seed, size)`).\n\n"
        "Grading runs your solution.py in a fresh process on hidden inputs, checks every output against the "
        "reference and times both: reward = 0.05 (parses) + 0.25 (imports) + 0.40 x pass rate "
        "+ 0.30 x min(speedup / 2, 1) x pass rate.\n"
    )
    return dest


@dataclass(frozen=True)
class GraderSettings:
    """How grade.py samples and times a candidate (its flags; grade.py's docstring says what each does)."""

    repeats: int = 5
    max_repeats: int = 15
    group: int = 3
    cases_per_size: int = 2
    call_timeout_s: float = 2.0
    import_timeout_s: float = 20.0

    def argv(self, timing_size: int = 0, python: str = "python") -> list[str]:
        """The command run in the sandbox, from the grading directory mounted at /workspace."""
        argv = [python, "-I", f"{WORKSPACE_MOUNT}/grade.py", "--dir", WORKSPACE_MOUNT]
        argv += ["--seed-file", f"{WORKSPACE_MOUNT}/{SEED_FILE}"]
        argv += ["--repeats", str(self.repeats), "--max-repeats", str(self.max_repeats)]
        argv += ["--group", str(self.group), "--cases-per-size", str(self.cases_per_size)]
        argv += ["--call-timeout", str(self.call_timeout_s), "--import-timeout", str(self.import_timeout_s)]
        if timing_size:
            argv += ["--timing-size", str(timing_size)]
        return argv


def grade_solution(
    task: KernelTask,
    source: str | bytes | None,
    *,
    seed: int | None = None,
    quick: bool = False,
    timing_size: int = 0,
    settings: GraderSettings = GraderSettings(),
    kind: SandboxKind = SandboxKind.BUBBLEWRAP,
    env_dir: Path | None = None,
    limits: Limits = GRADE_LIMITS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra_files: Sequence[tuple[str, bytes]] = (),
) -> GradeReport:
    """Grades `source` (the candidate's solution.py text; None: no file) in a fresh sandbox.

    `seed` is secret to the candidate (default: a random one); `quick` times at the task's quick_timing_size
    (`timing_size` overrides both). `extra_files` are written next to the candidate (tests use it to show
    that the agent's own copies of task files are ignored: they are overwritten by the pristine ones).
    """
    seed = secrets.randbits(62) if seed is None else seed
    nonce = secrets.token_hex(16)
    size = timing_size or (task.quick_timing_size if quick else task.timing_size)
    env = env_dir or kernel_env()
    work = leftovers.make_tempdir("kernel")
    try:
        for name, data in extra_files:
            (work / name).write_bytes(data)
        for name in PRISTINE_FILES:
            shutil.copyfile(task.path(name), work / name)
        shutil.copyfile(GRADE_SCRIPT, work / "grade.py")
        if source is not None:
            (work / "solution.py").write_bytes(source.encode() if isinstance(source, str) else source)
        else:
            (work / "solution.py").unlink(missing_ok=True)
        (work / SEED_FILE).write_text(json.dumps({"seed": seed, "nonce": nonce}))
        argv = settings.argv(size)
        with make_sandbox(kind, work, env_dir=env, image=None, limits=limits) as sandbox:
            run = sandbox.run(argv, timeout=timeout_s, limits=limits)
    finally:
        leftovers.remove_tree(work)
    line = _result_line(run.stdout, nonce)
    if line is None:
        if run.outcome is Outcome.SANDBOX_ERROR:
            return GradeReport(
                task.name,
                RunStatus.SANDBOX_ERROR,
                "sandbox_error",
                None,
                detail=run.detail,
                sandbox_wall_s=run.wall_s,
            )
        detail = f"{run.outcome.value}: {run.detail or run.stderr[-500:]}"
        log.warning("kernel grade of %s printed no result (%s)", task.name, detail)
        return GradeReport(
            task.name, RunStatus.NO_RESULT, "no_result", 0.0, detail=detail, sandbox_wall_s=run.wall_s
        )
    status = str(line.get("status", ""))
    internal = status == "internal_error"
    timing = line.get("timing") or {}
    return GradeReport(
        task=task.name,
        run_status=RunStatus.INTERNAL_ERROR if internal else RunStatus.GRADED,
        status=status,
        reward=None if internal else float(line["reward"]),
        syntax_ok=bool(line.get("syntax_ok")),
        imports_ok=bool(line.get("imports_ok")),
        tests_passed=int(line.get("tests_passed", 0)),
        tests_total=int(line.get("tests_total", 0)),
        speedup=float(line.get("speedup", 0.0)),
        candidate_s=line.get("candidate_s"),
        reference_s=line.get("reference_s"),
        noisy=bool(timing.get("noisy", False)),
        sandbox_wall_s=run.wall_s,
        detail=str(line.get("detail", "")),
        raw=line,
    )


def grade_workspace(task: KernelTask, workspace: Path, **kwargs: Any) -> GradeReport:
    """Grades the agent's workspace by its solution.py alone (every other file there is the agent's)."""
    path = workspace / "solution.py"
    return grade_solution(task, path.read_bytes() if path.is_file() else None, **kwargs)


def _result_line(stdout: str, nonce: str) -> dict[str, Any] | None:
    for text in reversed(stdout.splitlines()):
        text = text.strip()
        if not text.startswith("{"):
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("nonce") == nonce and "reward" in row:
            return row
    return None
