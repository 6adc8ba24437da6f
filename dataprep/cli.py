"""`harnessrl tasks synthesize|import|instruction|kernel|search|procedural|mix` and `harnessrl stage clean|validate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harnessrl.taskset import TaskLayout


def register(commands, stages) -> None:
    tasks = commands.add_parser(
        "tasks", help="make task-set directories (synthesize from a repo, import SWE-smith)"
    )
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)

    syn = sub.add_parser(
        "synthesize", help="procedurally generate SWE-smith tasks from a Python repo or sdist"
    )
    syn.add_argument("source", type=Path, help="a repository directory or an sdist .tar.gz")
    syn.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    syn.add_argument("--max-tasks", type=int, default=20, help="stop after this many tasks (default 20)")
    syn.add_argument("--seed", type=int, default=0, help="candidate order and constants (default 0)")
    syn.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds per test-suite run (mutated runs get min(this, max(10, 10x baseline)))",
    )
    syn.add_argument(
        "--max-candidates", type=int, default=None, help="bugs to try at most (default 5 * max-tasks + 10)"
    )
    syn.add_argument("--workers", type=int, default=2, help="test runs in parallel (default 2)")
    syn.add_argument("--name", default=None, help="repository name in ids (default: from the source name)")
    syn.set_defaults(func=_synthesize)

    ins = sub.add_parser(
        "instruction", help="generate instruction-following tasks (verifiable constraints) as a task set"
    )
    ins.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    ins.add_argument("--n", type=int, default=64, help="tasks (default 64)")
    ins.add_argument("--seed", type=int, default=0, help="task i depends only on (seed, i) (default 0)")
    ins.add_argument(
        "--split",
        choices=["train", "test", "all"],
        default="all",
        help="base requests to draw from: train and test never share one (default all)",
    )
    ins.add_argument(
        "--constraints", type=int, nargs="+", default=[1], help="constraints per task, drawn per task (1..3)"
    )
    ins.add_argument("--kinds", nargs="+", help="constraint kinds to draw from (default: every kind)")
    ins.add_argument(
        "--whole-reply",
        type=int,
        default=0,
        metavar="MIN_WORDS",
        help="tasks where saying less does not pay: one sentence of at least MIN_WORDS words holding a word of "
        "its own request, beside the drawn constraints (0: off, the default)",
    )
    ins.add_argument(
        "--eval-group", default=None, help="tag every task for an evaluation that reports its groups apart"
    )
    ins.set_defaults(func=_instruction)

    ker = sub.add_parser("kernel", help="kernel tasks (make a slow Python/NumPy function fast) as a task set")
    ker.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    ker.add_argument("--n", type=int, default=None, help="tasks (default: every task that matches)")
    ker.add_argument("--seed", type=int, default=0, help="task order (default 0)")
    ker.add_argument(
        "--split",
        choices=["train", "test", "all"],
        default="all",
        help="task folders to draw from: train and test alternate in difficulty order, never sharing one",
    )
    ker.add_argument(
        "--timing",
        choices=["full", "quick"],
        default="full",
        help="time at each task's timing_size (full) or its smaller quick_timing_size (default full)",
    )
    ker.add_argument("--difficulty", type=int, nargs="+", help="difficulties to keep (1..5; default all)")
    ker.add_argument("--names", nargs="+", help="task folders to keep (default all)")
    ker.add_argument("--from", dest="root", type=Path, default=None, help="task folders' directory")
    ker.set_defaults(func=_kernel)

    sea = sub.add_parser(
        "search", help="questions over a corpus of the installed packages' documentation, as a task set"
    )
    sea.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    sea.add_argument("--n", type=int, default=64, help="questions (default 64)")
    sea.add_argument("--seed", type=int, default=0, help="which questions are drawn (default 0)")
    sea.add_argument(
        "--split",
        choices=["train", "test", "all"],
        default="all",
        help="packages asked about: train and test never share one (default all)",
    )
    sea.add_argument(
        "--kinds",
        nargs="+",
        help="question kinds: license requires_python version package cloze (default all)",
    )
    sea.add_argument(
        "--site-dir",
        dest="site_dirs",
        type=Path,
        action="append",
        help="site-packages to build the corpus from (repeatable; default this interpreter's)",
    )
    sea.set_defaults(func=_search)

    pro = sub.add_parser("procedural", help="reasoning-gym tasks (seed, difficulty) as a task set")
    pro.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    pro.add_argument("--n", type=int, default=64, help="tasks (default 64)")
    pro.add_argument("--seed", type=int, default=0, help="reasoning-gym seed (held out: another seed)")
    pro.add_argument("--datasets", nargs="+", default=["chain_sum"], help="datasets, dealt round-robin")
    pro.add_argument(
        "--difficulty", type=int, default=0, help="curriculum level of every attribute (default 0)"
    )
    pro.add_argument(
        "--held-apart-from",
        type=Path,
        help="a task set (the training one) whose questions this one must not repeat (for a held-out set)",
    )
    pro.set_defaults(func=_procedural)

    mix = sub.add_parser(
        "mix", help="one task set of tasks from several (any environments); DIR:N takes N of a set's tasks"
    )
    mix.add_argument("parts", nargs="+", help="task-set directories, each DIR (all its tasks) or DIR:N")
    mix.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    mix.add_argument("--seed", type=int, default=0, help="which N tasks a DIR:N part gives (default 0)")
    mix.set_defaults(func=_mix)

    imp = sub.add_parser("import", help="turn downloaded SWE-smith/SWE-bench rows + repos into a task set")
    imp.add_argument("data", type=Path, help=".jsonl, .json, .parquet, or a HF `save_to_disk` directory")
    imp.add_argument(
        "--repos",
        default=None,
        help="directory of <owner>__<name>.bundle files (SWE-bench rows: also <owner>__<name>.git clones or "
        "mirrors), or for SWE-smith rows a git base URL (https://github.com) / URL template "
        "(https://host/{repo}.git) to clone from",
    )
    imp.add_argument(
        "--repo-dir",
        action="append",
        default=[],
        metavar="OWNER/NAME=PATH",
        help="SWE-bench rows: a local clone, mirror or bundle of one repo (repeatable)",
    )
    imp.add_argument(
        "--format",
        default="auto",
        choices=["auto", *TaskLayout],
        help="row format (default auto: swebench when the rows carry a test_patch)",
    )
    imp.add_argument("--out", required=True, type=Path, help="task-set directory to write (replaced)")
    imp.add_argument(
        "--allow-extra-fields", action="store_true", help="keep columns the loader does not know"
    )
    imp.set_defaults(func=_import)

    clean = stages.add_parser("clean", help="drop bad task rows, keeping every rejected row with its reasons")
    clean.add_argument("--tasks", required=True, type=Path, help="input task-set directory")
    clean.add_argument(
        "--out",
        required=True,
        type=Path,
        help="output dir (replaced): kept/, rejected.jsonl, metrics.json, report.md, reasons.png",
    )
    clean.add_argument("--max-tests", type=int, default=200, help="reject rows with more F2P+P2P tests (200)")
    clean.add_argument("--min-problem-statement-chars", type=int, default=1)
    clean.add_argument("--allow-empty-f2p", action="store_true", help="keep rows with empty FAIL_TO_PASS")
    clean.add_argument("--allow-empty-problem-statement", action="store_true")
    clean.add_argument(
        "--no-check-branches", action="store_true", help="skip the task-branch-in-bundle check"
    )
    clean.add_argument("--keep-duplicates", action="store_true")
    clean.add_argument("--allow-unparsable-patch", action="store_true")
    clean.set_defaults(func=_clean)

    val = stages.add_parser("validate", help="run the Great Expectations suite over a task set")
    val.add_argument("--tasks", required=True, type=Path, help="input task-set directory")
    val.add_argument(
        "--out", required=True, type=Path, help="output dir: gx_results.json, metrics.json, report.md"
    )
    val.add_argument("--no-fail", action="store_true", help="exit 0 even when the suite fails")
    val.set_defaults(func=_validate)


def _repo_dirs(values: list[str]) -> dict[str, Path]:
    from harnessrl.cli import UserError

    out = {}
    for v in values:
        repo, sep, path = v.partition("=")
        if not sep or repo.count("/") != 1 or not path:
            raise UserError(
                f"--repo-dir {v!r}: expected OWNER/NAME=PATH, e.g. django/django=/data/django.git"
            )
        out[repo] = Path(path)
    return out


def _git_errors_as_user_errors(func):
    def wrapper(args: argparse.Namespace) -> int:
        from dataprep.gitrepo import GitError
        from harnessrl.cli import UserError

        try:
            return func(args)
        except GitError as e:
            raise UserError(str(e)) from None

    return wrapper


@_git_errors_as_user_errors
def _synthesize(args: argparse.Namespace) -> int:
    from dataprep.synthesize import synthesize_taskset

    ts = synthesize_taskset(
        args.source,
        args.out,
        max_tasks=args.max_tasks,
        seed=args.seed,
        timeout_s=args.timeout,
        max_candidates=args.max_candidates,
        workers=args.workers,
        name=args.name,
    )
    syn = ts.manifest["synthesis"]
    print(f"{syn['kept']} tasks from {syn['candidates_tried']} candidate bugs -> {ts.root}")
    for reason, n in syn["rejected_by_reason"].items():
        print(f"  rejected {n:4d}  {reason}")
    if not syn["kept"]:
        print("harnessrl: no task survived; see manifest.json (raise --max-candidates?)", file=sys.stderr)
        return 1
    return 0


@_git_errors_as_user_errors
def _import(args: argparse.Namespace) -> int:
    from dataprep.load import import_taskset

    repo_dirs = _repo_dirs(args.repo_dir)
    ts = import_taskset(
        args.data,
        args.repos,
        args.out,
        allow_extra=args.allow_extra_fields,
        repo_dirs=repo_dirs,
        layout=None if args.format == "auto" else TaskLayout(args.format),
    )
    info = ts.manifest["import"]
    if info.get("format") == TaskLayout.SWEBENCH:
        return _report_swebench_import(ts)
    print(f"{ts.manifest['tasks']} rows, {len(ts.manifest['repos'])} repo bundle(s) -> {ts.root}")
    for repo, why in info["missing_repos"].items():
        print(
            f"  missing repo {repo}: {why} (its rows will be rejected by `harnessrl stage clean`)",
            file=sys.stderr,
        )
    return 0


def _report_swebench_import(ts) -> int:
    from dataprep.swebench import reject_lines

    info = ts.manifest["import"]
    print(f"{info['converted']} SWE-bench rows converted, {info['rejected']} rejected -> {ts.root}")
    for repo, why in info["missing_repos"].items():
        print(f"  missing repo {repo}: {why}", file=sys.stderr)
    for line in reject_lines(ts):
        print(f"  rejected {line}", file=sys.stderr)
    if info["rejected"]:
        print(f"  every rejected row with its reason: {ts.root / 'rejects.jsonl'}", file=sys.stderr)
    return 0 if info["converted"] else 1


def _clean(args: argparse.Namespace) -> int:
    from dataprep.clean import CleanParams, run_clean_stage

    params = CleanParams(
        max_tests=args.max_tests,
        require_f2p=not args.allow_empty_f2p,
        require_problem_statement=not args.allow_empty_problem_statement,
        min_problem_statement_chars=args.min_problem_statement_chars,
        check_branches=not args.no_check_branches,
        drop_duplicates=not args.keep_duplicates,
        require_parsable_patch=not args.allow_unparsable_patch,
    )
    report = run_clean_stage(args.tasks, args.out, params)
    print(report.markdown())
    return 0


def _validate(args: argparse.Namespace) -> int:
    from dataprep.validate import validate_taskset

    report = validate_taskset(args.tasks, args.out, raise_on_failure=False)
    print(report.summary(), file=sys.stdout if report.success else sys.stderr)
    return 0 if report.success or args.no_fail else 1


def _instruction(args: argparse.Namespace) -> int:
    from harnessrl.environments.instruction.env import PromptSplit, write_instruction_taskset
    from harnessrl.environments.instruction.prompts import WholeReply

    taskset = write_instruction_taskset(
        args.out,
        args.n,
        args.seed,
        PromptSplit(args.split),
        tuple(args.constraints),
        tuple(args.kinds) if args.kinds else None,
        whole_reply=WholeReply(args.whole_reply) if args.whole_reply else None,
        eval_group=args.eval_group,
    )
    print(f"{taskset.root}: {len(taskset.rows())} instruction tasks")
    return 0


def _kernel(args: argparse.Namespace) -> int:
    from harnessrl.environments.kernel.env import TASKS_DIR, KernelSplit, Timing, write_kernel_taskset

    taskset = write_kernel_taskset(
        args.out,
        args.n,
        args.seed,
        KernelSplit(args.split),
        Timing(args.timing),
        args.names,
        args.difficulty,
        args.root or TASKS_DIR,
    )
    print(f"{taskset.root}: {len(taskset.rows())} kernel tasks")
    return 0


def _search(args: argparse.Namespace) -> int:
    from harnessrl.environments.search.env import SearchSplit, write_search_taskset

    taskset = write_search_taskset(
        args.out, args.n, args.seed, SearchSplit(args.split), args.kinds, args.site_dirs
    )
    corpus = taskset.manifest.get("corpus", {})
    print(f"{taskset.root}: {len(taskset.rows())} search questions over {corpus.get('passages')} passages")
    return 0


def _procedural(args: argparse.Namespace) -> int:
    from harnessrl.environments.procedural.env import questions_of, write_procedural_taskset
    from harnessrl.environments.procedural.source import ReasoningGymMissing

    seen = questions_of(args.held_apart_from) if args.held_apart_from else set()
    try:
        taskset = write_procedural_taskset(
            args.out, args.n, args.seed, tuple(args.datasets), args.difficulty, held_apart=seen
        )
    except ReasoningGymMissing as e:
        print(f"harnessrl: error: {e}", file=sys.stderr)
        return 2
    print(f"{taskset.root}: {len(taskset.rows())} procedural tasks")
    return 0


def _mix(args: argparse.Namespace) -> int:
    from collections import Counter

    from harnessrl.environments.registry import environment_name
    from harnessrl.taskset import MixPart, mix_tasksets

    taskset = mix_tasksets(args.out, [MixPart.parse(p) for p in args.parts], args.seed)
    counts = Counter(environment_name(r) for r in taskset.rows())
    print(
        f"{taskset.root}: {sum(counts.values())} tasks ({', '.join(f'{e} {n}' for e, n in sorted(counts.items()))})"
    )
    return 0
