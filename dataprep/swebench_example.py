"""A SWE-bench-format example set synthesized from a real Python package (tests, the learning benchmark).

    build_example_set(source, out, *, n_tasks=3, seed=0, tier=ProblemTier.EASY, ...) -> ExampleSet
    example_taskset(source, out, *, n_tasks=..., ...) -> Path   (the set, imported: a task-set directory)
    python -m dataprep.swebench_example --source SDIST_OR_DIR --out DIR [--tasks N] [--seed S] [--tier easy]
        [--repo OWNER/NAME] [--taskset DIR]

Writes `<out>/rows.jsonl` (SWE-bench rows: every value a string, FAIL_TO_PASS / PASS_TO_PASS JSON-encoded
lists, as in the public datasets), `<out>/mirrors/<owner>__<name>.bundle` (the "upstream" history a clone
would hold: `main` = the package; per task a branch `pr-<n>` = the base commit, with the bug present and the
tests that catch it absent, then the fix commit, source fix + tests, on top) and `<out>/manifest.json`.

How: bugs come from `synthesize_taskset` (real mutations, kept only when the package's tests catch them). For
each, the base commit is the bug with the catching test functions removed from their files (whole files only
when a file would not parse without them); the fix commit is the package as released. `patch` is the PR's diff
on non-test files and `test_patch` on test files, as SWE-bench splits a PR. FAIL_TO_PASS / PASS_TO_PASS are
then measured SWE-bench's way, by running the files `test_patch` touches on base + test_patch (before) and on
the fix commit (after): F2P = fail before and pass after; P2P = pass both. A task with no F2P is skipped.

Problem tiers (`ProblemTier`): `easy` names the file and the function to fix and quotes one failure; `tests`
is the SWE-smith template (failing behaviours and messages only, no location).
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dataprep.gitrepo import create_bundle, git
from dataprep.problem import problem_statement
from dataprep.pytest_runner import TestRun, run_pytest
from dataprep.source import is_test_path
from dataprep.synthesize import synthesize_taskset
from harnessrl.io import atomic_output, write_jsonl
from harnessrl.taskset import TaskLayout, TaskSet

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_MAX_MESSAGE = 200


class ProblemTier(StrEnum):
    EASY = "easy"  # names the file and the function, quotes one failure
    TESTS = "tests"  # failing behaviours only (SWE-smith's template)


@dataclass
class ExampleSet:
    root: Path
    rows: list[dict]

    @property
    def rows_path(self) -> Path:
        return self.root / "rows.jsonl"

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors"


def _test_function_spans(text: str, names: list[list[str]]) -> list[tuple[int, int]] | None:
    """1-based inclusive line spans of the named test functions (`[class..., function]`), or None if one is
    not a plain def the file can lose."""
    tree = ast.parse(text)
    spans = []
    for path in names:
        body: list[ast.stmt] = tree.body
        node: ast.stmt | None = None
        for part in path:
            node = next(
                (
                    n
                    for n in body
                    if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.name == part
                ),
                None,
            )
            if node is None:
                return None
            body = node.body if isinstance(node, ast.ClassDef) else []
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        spans.append((start, node.end_lineno or node.lineno))
    return sorted(set(spans))


def _remove_tests(repo: Path, f2p: list[str]) -> None:
    """Removes the F2P test functions from their files in the work tree (a whole file if that fails)."""
    by_file: dict[str, list[list[str]]] = {}
    for t in f2p:
        file, *parts = t.split("::")
        by_file.setdefault(file, []).append([re.sub(r"\[.*$", "", p) for p in parts])
    for file, names in sorted(by_file.items()):
        path = repo / file
        text = path.read_text(encoding="utf-8")
        spans = _test_function_spans(text, names)
        lines = text.splitlines(keepends=True)
        if spans is not None:
            drop = {i for a, b in spans for i in range(a - 1, b)}
            kept = "".join(line for i, line in enumerate(lines) if i not in drop)
            try:
                ast.parse(kept)
            except SyntaxError:
                spans = None
            else:
                path.write_text(kept, encoding="utf-8")
        if spans is None:
            path.unlink()


def _changed_line(patch: str) -> tuple[str, int]:
    """(file, first changed line in the fixed file) of a fix patch."""
    file, line = "", 0
    for text in patch.splitlines():
        if text.startswith("+++ b/") and not file:
            file = text[len("+++ b/") :]
        m = _HUNK.match(text)
        if m and not line:
            line = int(m[1])
        elif line and file and text[:1] in "+-":
            return file, line
        elif line and text.startswith(" "):
            line += 1
    return file, line


def enclosing_function(source: str, line: int) -> str | None:
    """Qualified name (Class.method) of the innermost function containing `line`, or None."""
    best: tuple[int, str] | None = None

    def visit(nodes: list[ast.stmt], prefix: str) -> None:
        nonlocal best
        for n in nodes:
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{n.name}"
                if n.lineno <= line <= (n.end_lineno or n.lineno):
                    if not isinstance(n, ast.ClassDef) and (best is None or n.lineno >= best[0]):
                        best = (n.lineno, name)
                    visit(n.body, f"{name}.")

    visit(ast.parse(source).body, "")
    return best[1] if best else None


def easy_statement(file: str, function: str | None, f2p: list[str], messages: dict[str, str]) -> str:
    where = f"`{function}` in `{file}`" if function else f"`{file}`"
    message = next((messages[t] for t in f2p if messages.get(t)), "")
    lines = [
        f"Bug in {where}",
        "",
        f"{where} does not behave as documented: {len(f2p)} test case(s) of its behaviour fail.",
    ]
    if message:
        lines += ["", f"One of them fails with: `{message.replace(chr(10), ' ')[:_MAX_MESSAGE]}`"]
    lines += ["", f"Please fix {where}; the rest of the library must keep working."]
    return "\n".join(lines) + "\n"


def _run_tree(repo: Path, rev: str, files: list[str], scratch: Path, timeout_s: float) -> TestRun:
    tree = scratch / f"run-{rev[:12]}"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), rev)
    try:
        return run_pytest(tree, files, timeout_s)
    finally:
        git(repo, "worktree", "remove", "--force", str(tree))


def _diff(repo: Path, a: str, b: str, tests: bool) -> str:
    names = git(repo, "diff", "--name-only", a, b).split()
    paths = [p for p in names if is_test_path(p) == tests]
    return git(repo, "diff", a, b, "--", *paths) if paths else ""


def build_example_set(
    source: Path,
    out: Path,
    *,
    n_tasks: int = 3,
    seed: int = 0,
    tier: ProblemTier = ProblemTier.EASY,
    repo: str | None = None,
    version: str | None = None,
    timeout_s: float = 120.0,
    workers: int = 2,
    max_candidates: int | None = None,
) -> ExampleSet:
    """Writes rows.jsonl, mirrors/<owner>__<name>.bundle and manifest.json to `out` (replaced atomically).
    The same source and arguments give byte-identical output."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-swe-example-") as tmp:
        scratch = Path(tmp)
        smith = synthesize_taskset(
            Path(source),
            scratch / "smith",
            max_tasks=n_tasks,
            seed=seed,
            timeout_s=timeout_s,
            workers=workers,
            max_candidates=max_candidates,
        )
        syn = smith.manifest["synthesis"]
        name = syn["name"]
        repo = repo or f"harnessrl-examples/{name}"
        version = version or _version_of(Path(source))
        date = smith.rows()[0]["created_at"] if smith.rows() else "2000-01-01T00:00:00Z"
        rows, mirror = _build_rows(smith, scratch, repo, version, date, tier, seed, timeout_s)
        with atomic_output(Path(out)) as dest:
            (dest / "mirrors").mkdir(parents=True)
            create_bundle(mirror, dest / "mirrors" / f"{repo.replace('/', '__')}.bundle")
            write_jsonl(dest / "rows.jsonl", rows)
            manifest = {
                "source": Path(source).name,
                "repo": repo,
                "version": version,
                "seed": seed,
                "tier": str(tier),
                "n_tasks_requested": n_tasks,
                "n_tasks": len(rows),
                "python": sys.version.split()[0],
                "synthesis_candidates_tried": syn["candidates_tried"],
            }
            (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            (dest / "README.md").write_text(_readme(manifest, bool(max_candidates)))
    return ExampleSet(Path(out), rows)


def _readme(m: dict, custom_candidates: bool) -> str:
    name = m["repo"].replace("/", "__")
    extra = "" if m["repo"].startswith("harnessrl-examples/") else f" --repo {m['repo']}"
    extra += " --max-candidates N" if custom_candidates else ""
    return f"""# SWE-bench-format example set ({m["source"]})

- `rows.jsonl`: {m["n_tasks"]} rows with the public SWE-bench field names and types (`repo`, `instance_id`,
  `base_commit`, `patch`, `test_patch`, `problem_statement`, `hints_text`, `created_at`, `version`,
  `FAIL_TO_PASS`, `PASS_TO_PASS`, `environment_setup_commit`; every value a string, the test lists
  JSON-encoded).
- `mirrors/{name}.bundle`: the "upstream" repository a clone would hold: `main` = the released package; per
  task a branch `pr-<n>` = the base commit (bug present, the tests that catch it absent), then the fix commit
  (source fix + tests). `patch` / `test_patch` are the fix commit's diff on source / test files.
- `manifest.json`: the generator's inputs.

Values are synthesized (bugs planted as `harnessrl tasks synthesize` does); FAIL_TO_PASS / PASS_TO_PASS were
measured by running the test files `test_patch` touches before and after the fix. Problem statements: tier
`{m["tier"]}`. Regenerate (byte-identical output for the same source and Python):

```bash
.venv/bin/python -m dataprep.swebench_example --source {m["source"]} --out <this dir> --tasks {m["n_tasks_requested"]} --seed {m["seed"]} --tier {m["tier"]}{extra}
.venv/bin/harnessrl tasks import <this dir>/rows.jsonl --repos <this dir>/mirrors --out runs/tasks-swe
```
"""


def _version_of(source: Path) -> str:
    m = re.search(r"-(\d+)\.(\d+)", source.name)
    return f"{m[1]}.{m[2]}" if m else "0.0"


def _build_rows(
    smith: TaskSet,
    scratch: Path,
    repo: str,
    version: str,
    date: str,
    tier: ProblemTier,
    seed: int,
    timeout_s: float,
) -> tuple[list[dict], Path]:
    [bundle] = sorted((smith.root / "repos").glob("*.bundle"))
    work = scratch / "upstream"
    git(scratch, "clone", "-q", "--single-branch", "-b", "main", str(bundle), str(work))
    git(work, "remote", "remove", "origin")  # the mirror holds main and the PR branches only
    released = git(work, "rev-parse", "HEAD").strip()
    git_date = date.replace("Z", "+0000")
    owner, short = repo.split("/", 1)
    rows = []
    for i, task in enumerate(smith.rows()):
        number = 1001 + i
        branch = f"pr-{number}"
        git(work, "checkout", "-q", "-b", branch, released)
        git(work, "apply", "-", input=task["patch"].encode())  # the bug
        _remove_tests(work, task["FAIL_TO_PASS"])
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"Rework {_changed_line(task['patch'])[0]}", date=git_date)
        base = git(work, "rev-parse", "HEAD").strip()
        git(work, "checkout", "-q", released, "--", ".")
        git(work, "commit", "-q", "-m", f"Fix the regression from {base[:7]} (#{number})", date=git_date)
        fixed = git(work, "rev-parse", "HEAD").strip()
        git(work, "checkout", "-q", "main")
        patch, test_patch = _diff(work, base, fixed, tests=False), _diff(work, base, fixed, tests=True)
        files = sorted({f[len("+++ b/") :] for f in test_patch.splitlines() if f.startswith("+++ b/")})
        before_tree = f"{branch}-before"
        git(work, "checkout", "-q", "-b", before_tree, base)
        git(work, "apply", "-", input=test_patch.encode())
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "tests on the base", date=git_date)
        before = _run_tree(work, git(work, "rev-parse", "HEAD").strip(), files, scratch, timeout_s)
        git(work, "checkout", "-q", "main")
        git(work, "branch", "-q", "-D", before_tree)
        after = _run_tree(work, fixed, files, scratch, timeout_s)
        f2p = sorted(t for t in after.passed() if t not in before.passed())
        p2p = sorted(t for t in after.passed() if t in before.passed())
        if not f2p:
            git(work, "branch", "-q", "-D", branch)
            continue
        file, line = _changed_line(patch)
        function = enclosing_function(git(work, "show", f"{fixed}:{file}"), line)
        if tier is ProblemTier.EASY:
            statement = easy_statement(file, function, f2p, before.messages)
        else:
            rng = random.Random(f"{seed}:{number}")
            statement = problem_statement(f2p, before.messages, len(p2p), rng)
        rows.append(
            {
                "repo": repo,
                "instance_id": f"{owner}__{short}-{number}",
                "base_commit": base,
                "patch": patch,
                "test_patch": test_patch,
                "problem_statement": statement,
                "hints_text": "",
                "created_at": date,
                "version": version,
                "FAIL_TO_PASS": json.dumps(f2p),
                "PASS_TO_PASS": json.dumps(p2p),
                "environment_setup_commit": released,
            }
        )
    return rows, work


def example_taskset(source: Path, out: Path, **kw) -> Path:
    """`build_example_set` into `<out>/example`, imported as a task set at `<out>/tasks`; returns the latter."""
    from dataprep.load import import_taskset

    ex = build_example_set(source, Path(out) / "example", **kw)
    ts = import_taskset(ex.rows_path, ex.mirrors, Path(out) / "tasks", layout=TaskLayout.SWEBENCH)
    return ts.root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dataprep.swebench_example",
        description="A SWE-bench-format example set synthesized from a real Python package.",
    )
    p.add_argument("--source", required=True, type=Path, help="a package sdist (.tar.gz) or repo directory")
    p.add_argument("--out", required=True, type=Path, help="directory to write (replaced)")
    p.add_argument("--tasks", type=int, default=3, help="tasks to make (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tier", choices=list(ProblemTier), default=ProblemTier.EASY)
    p.add_argument("--repo", default=None, help="OWNER/NAME in the rows (default harnessrl-examples/<name>)")
    p.add_argument("--max-candidates", type=int, default=None, help="bugs to try at most")
    p.add_argument("--taskset", type=Path, default=None, help="also import the set as a task set here")
    args = p.parse_args(argv)
    ex = build_example_set(
        args.source,
        args.out,
        n_tasks=args.tasks,
        seed=args.seed,
        tier=ProblemTier(args.tier),
        repo=args.repo,
        max_candidates=args.max_candidates,
    )
    print(f"{len(ex.rows)} SWE-bench rows -> {ex.rows_path}; mirror in {ex.mirrors}")
    if args.taskset is not None:
        from dataprep.load import import_taskset

        ts = import_taskset(ex.rows_path, ex.mirrors, args.taskset, layout=TaskLayout.SWEBENCH)
        print(f"task set: {ts.root} ({ts.manifest['tasks']} tasks)")
    return 0 if ex.rows else 1


if __name__ == "__main__":
    sys.exit(main())
