"""Synthesize SWE-smith-format tasks from a Python repository (a directory or an sdist .tar.gz).

Flow (SWE-smith's procedural bug generation, on one host):
1. copy the source without VCS/build debris; run its pytest suite twice -> the stable passing tests;
2. enumerate (file, modifier, site) candidates in non-test source files; order them by the seed,
   interleaving modifier families;
3. per candidate: apply the bug in a work copy, run the suite; keep it when >= 1 stable test fails (F2P)
   and >= 1 still passes (P2P);
4. in a git repo whose `main` is one squashed "Initial commit": branch `<instance_id>` = "Bug Patch" +
   "Remove F2P Tests"; `patch` = `git diff main <instance_id>~1`; check that the gold fix (the reverse
   patch, test files restored) makes F2P and P2P pass, else drop the branch;
5. write the task set (tasks.jsonl, one bundle, manifest with every candidate's fate and reason).
"""

from __future__ import annotations

import functools
import logging
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from dataprep.gitrepo import GitError, create_bundle, git, init_squashed
from dataprep.mutations import MODIFIERS, Candidate, enumerate_candidates, mutate_source
from dataprep.problem import problem_statement
from dataprep.pytest_runner import TestRun, TestRunner, run_pytest
from dataprep.source import SynthesisError, newest_mtime_iso, prepare_source, source_files
from harnessrl.progress import ProgressBar
from harnessrl.taskset import TaskSet, write_taskset

logger = logging.getLogger(__name__)


class CandidateStatus(StrEnum):
    KEPT = "kept"
    REJECTED = "rejected"


@dataclass
class CandidateResult:
    file: str
    modifier: str
    site: int
    status: CandidateStatus
    reason: str = ""
    instance_id: str = ""
    n_f2p: int = 0
    n_p2p: int = 0
    seconds: float = 0.0
    f2p: list[str] = field(default_factory=list, repr=False)
    p2p: list[str] = field(default_factory=list, repr=False)
    messages: dict[str, str] = field(default_factory=dict, repr=False)

    def manifest_entry(self) -> dict:
        d = asdict(self)
        for k in ("f2p", "p2p", "messages"):
            d.pop(k)
        return d


def order_candidates(candidates: Sequence[Candidate], seed: int) -> list[Candidate]:
    """Seeded shuffle within each modifier family, then round-robin across families (diverse first tasks)."""
    rng = random.Random(seed)
    families: dict[str, list[Candidate]] = {}
    for c in candidates:
        families.setdefault(c.modifier, []).append(c)
    names = sorted(families)
    rng.shuffle(names)
    for n in names:
        rng.shuffle(families[n])
    ordered: list[Candidate] = []
    while any(families.values()):
        for n in names:
            if families[n]:
                ordered.append(families[n].pop(0))
    return ordered


# ---------------------------------------------------------------- evaluation


def _evaluate(run: TestRun, stable: set[str]) -> tuple[str, list[str], list[str]]:
    if run.timed_out:
        return "tests timed out (the bug probably loops forever)", [], []
    passed = run.passed()
    f2p = sorted(stable - passed)
    p2p = sorted(stable & passed)
    if not f2p:
        return "no FAIL_TO_PASS test: the suite does not detect this change", f2p, p2p
    if not p2p:
        return "no PASS_TO_PASS test: the change breaks every test", f2p, p2p
    return "", f2p, p2p


def _run_mutated(
    workdir: Path, rel: str, mutated: str, original: str, runner: TestRunner, timeout_s: float
) -> TestRun:
    target = workdir / rel
    target.write_text(mutated, encoding="utf-8")
    try:
        return runner(workdir, (), timeout_s)
    finally:
        target.write_text(original, encoding="utf-8")


def _test_file(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def _make_branch(repo: Path, iid: str, rel: str, mutated: str, f2p_files: list[str], date: str) -> str:
    """Creates branch `iid` (Bug Patch + Remove F2P Tests) from main; returns the bug patch."""
    git(repo, "checkout", "-q", "-b", iid, "main")
    try:
        (repo / rel).write_text(mutated, encoding="utf-8")
        git(repo, "commit", "-q", "-a", "-m", "Bug Patch", date=date)
        git(repo, "rm", "-q", "--", *f2p_files)
        git(repo, "commit", "-q", "-m", "Remove F2P Tests", date=date)
    finally:
        git(repo, "checkout", "-q", "-f", "main")
    return git(repo, "diff", "main", f"{iid}~1")


def _gold_check(
    repo: Path,
    iid: str,
    patch: str,
    f2p_files: list[str],
    tests: list[str],
    runner: TestRunner,
    timeout_s: float,
    scratch: Path,
) -> str:
    """'' when the reverse patch on the task branch (tests restored) makes every F2P and P2P test pass."""
    tree = scratch / f"gold-{iid}"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), iid)
    try:
        git(tree, "checkout", "main", "--", *f2p_files)
        git(tree, "apply", "-R", "-", input=patch.encode())
        run = runner(tree, tests, timeout_s)
    except GitError as e:
        return f"gold fix does not apply: {e}"
    finally:
        git(repo, "worktree", "remove", "--force", str(tree))
    if run.timed_out:
        return "gold fix check timed out"
    missing = sorted(set(tests) - run.passed())
    if missing:
        return f"gold fix leaves {len(missing)} test(s) failing, e.g. {missing[0]}"
    return ""


# ---------------------------------------------------------------- main entry


def _choose_local_runner(workdir: Path, timeout_s: float) -> tuple[TestRunner, TestRun, TestRun]:
    """The local runner, without plugin autoload when that changes nothing; plus two baseline runs."""
    with_plugins = run_pytest(workdir, (), timeout_s)
    lean: TestRunner = functools.partial(run_pytest, plugin_autoload=False)
    without = lean(workdir, (), timeout_s)
    if not without.timed_out and without.passed() == with_plugins.passed():
        return lean, with_plugins, without
    return run_pytest, with_plugins, run_pytest(workdir, (), timeout_s)


def synthesize_taskset(
    source: Path,
    out: Path,
    *,
    max_tasks: int = 20,
    seed: int = 0,
    timeout_s: float = 120,
    max_candidates: int | None = None,
    workers: int = 2,
    runner: TestRunner | None = None,
    name: str | None = None,
) -> TaskSet:
    """Writes a task set of up to `max_tasks` procedurally generated SWE-smith tasks to `out`.

    `timeout_s` bounds each test run (runs of a mutated suite get min(timeout_s, max(10 s, 10x baseline))).
    `max_candidates` bounds how many mutations are tested (default 5 * max_tasks + 10).
    `runner` runs pytest in a directory (default: a local subprocess, see pytest_runner.run_pytest; pytest
    plugin autoloading is switched off when the baseline passes the same tests without it).
    """
    if max_tasks < 1:
        raise SynthesisError(f"--max-tasks must be >= 1 (got {max_tasks})")
    source = Path(source)
    if not source.exists():
        raise SynthesisError(f"{source}: no such file or directory")
    max_candidates = max_candidates if max_candidates is not None else 5 * max_tasks + 10
    workers = max(1, workers)
    with tempfile.TemporaryDirectory(prefix="harnessrl-synth-") as tmp_str:
        tmp = Path(tmp_str)
        clean = tmp / "clean"
        detected = prepare_source(source, clean)
        repo_name = name or detected
        date = newest_mtime_iso(clean)
        sources = source_files(clean)
        if not sources:
            raise SynthesisError(f"{source}: no non-test Python source files to plant bugs in")

        work = [tmp / f"work{i}" for i in range(workers)]
        for w in work:
            shutil.copytree(clean, w)
        if runner is None:
            runner, first, second = _choose_local_runner(work[0], timeout_s)
        else:
            first, second = runner(work[0], (), timeout_s), runner(work[0], (), timeout_s)
        if first.timed_out:
            raise SynthesisError(
                f"{source}: its test suite did not finish within {timeout_s:g} s (raise --timeout)"
            )
        stable = first.passed() & second.passed()
        flaky = sorted(first.passed() ^ second.passed())
        if not stable:
            raise SynthesisError(
                f"{source}: no test passes on the unmodified source, so no task can be verified. "
                f"pytest said (exit {first.returncode}):\n{first.log_tail[-1500:]}"
            )
        run_timeout = min(timeout_s, max(10.0, 10 * max(first.seconds, second.seconds)))

        repo = tmp / "git"
        shutil.copytree(clean, repo)
        base_sha = init_squashed(repo, date)
        short = base_sha[:7]
        repo_id = f"swesmith/{repo_name}.{base_sha[:8]}"

        ordered = order_candidates(enumerate_candidates(sources, MODIFIERS), seed)
        results: list[CandidateResult] = []
        rows: list[dict] = []
        counters: Counter[str] = Counter()
        seen: set[tuple[str, str]] = set()
        queue = iter(ordered)
        tried = 0
        bar = ProgressBar(f"synthesize {repo_name}: 0 tasks", total=min(max_candidates, len(ordered)))
        with bar, ThreadPoolExecutor(max_workers=workers) as pool:
            while len(rows) < max_tasks and tried < max_candidates:
                batch: list[tuple[Candidate, str]] = []
                for cand in queue:
                    mutated = mutate_source(sources[cand.path], cand, seed)
                    if mutated is None or (cand.path, mutated) in seen:
                        continue
                    seen.add((cand.path, mutated))
                    batch.append((cand, mutated))
                    if len(batch) == min(workers, max_candidates - tried):
                        break
                if not batch:
                    break
                futures = [
                    pool.submit(_run_mutated, work[i], c.path, m, sources[c.path], runner, run_timeout)
                    for i, (c, m) in enumerate(batch)
                ]
                for (cand, mutated), fut in zip(batch, futures, strict=True):
                    tried += 1
                    run = fut.result()
                    res = CandidateResult(
                        cand.path, cand.modifier, cand.site, CandidateStatus.REJECTED, seconds=run.seconds
                    )
                    results.append(res)
                    bar.advance()
                    if len(rows) >= max_tasks:
                        res.reason = "not needed: --max-tasks reached"
                        continue
                    res.reason, res.f2p, res.p2p = _evaluate(run, stable)
                    res.n_f2p, res.n_p2p = len(res.f2p), len(res.p2p)
                    if res.reason:
                        continue
                    row = _accept(
                        repo,
                        res,
                        mutated,
                        run,
                        counters,
                        short,
                        repo_id,
                        base_sha,
                        date,
                        seed,
                        runner,
                        run_timeout,
                        tmp,
                    )
                    if row is not None:
                        rows.append(row)
                        bar.advance(0, description=f"synthesize {repo_name}: {len(rows)} tasks")

        bundle = create_bundle(repo, tmp / "repo.bundle")
        reasons = Counter(r.reason.split(":")[0] for r in results if r.status is CandidateStatus.REJECTED)
        manifest = {
            "synthesis": {
                "source": str(source),
                "name": repo_name,
                "seed": seed,
                "max_tasks": max_tasks,
                "max_candidates": max_candidates,
                "base_commit": base_sha,
                "python": sys.version.split()[0],
                "baseline": {
                    "tests": len(first.outcomes),
                    "stable_passing": len(stable),
                    "flaky": flaky,
                    "seconds": round(first.seconds, 3),
                },
                "candidates_available": len(ordered),
                "candidates_tried": tried,
                "kept": len(rows),
                "rejected_by_reason": dict(sorted(reasons.items())),
                "candidates": [r.manifest_entry() for r in results],
            }
        }
        logger.info("%s: %d tasks from %d candidate bugs tried", repo_name, len(rows), tried)
        return write_taskset(
            out, rows, {repo_id: bundle}, source=f"synthesize:{source}", extra_manifest=manifest
        )


def _accept(
    repo: Path,
    res: CandidateResult,
    mutated: str,
    run: TestRun,
    counters: Counter[str],
    short: str,
    repo_id: str,
    base_sha: str,
    date: str,
    seed: int,
    runner: TestRunner,
    timeout_s: float,
    scratch: Path,
) -> dict | None:
    """Builds the task branch and checks the gold fix; returns the task row, or None (reason set on res)."""
    repo_name = repo_id.split("/", 1)[1].rsplit(".", 1)[0]
    iid = f"{repo_name}.{short}__{res.modifier}__{counters[res.modifier]}"
    f2p_files = sorted({_test_file(t) for t in res.f2p})
    missing = [f for f in f2p_files if not (repo / f).is_file()]
    if missing:
        res.reason = f"cannot locate F2P test file(s) {missing} in the repository"
        return None
    patch = _make_branch(repo, iid, res.file, mutated, f2p_files, date)
    failure = _gold_check(repo, iid, patch, f2p_files, res.f2p + res.p2p, runner, timeout_s, scratch)
    if failure:
        git(repo, "branch", "-q", "-D", iid)
        res.reason = failure
        return None
    counters[res.modifier] += 1
    res.status, res.reason, res.instance_id = CandidateStatus.KEPT, "", iid
    res.messages = {t: run.messages.get(t, "") for t in res.f2p}
    rng = random.Random(f"{seed}:{iid}")
    return {
        "instance_id": iid,
        "repo": repo_id,
        "patch": patch,
        "FAIL_TO_PASS": res.f2p,
        "PASS_TO_PASS": res.p2p,
        "image_name": f"swesmith.x86_64.{repo_id.split('/', 1)[1]}",
        "problem_statement": problem_statement(res.f2p, res.messages, len(res.p2p), rng),
        "created_at": date,
        "base_commit": base_sha,
    }
