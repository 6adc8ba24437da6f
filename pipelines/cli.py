"""`harnessrl compile | submit | run | pipelines | demo` (registered into harnessrl/cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harnessrl.cli import UserError


def register(commands: argparse._SubParsersAction, stages: argparse._SubParsersAction) -> None:
    from pipelines.local_run import Runner

    p = commands.add_parser("pipelines", help="list the pipelines and whether this checkout can build them")
    p.set_defaults(func=cmd_pipelines)

    p = commands.add_parser("compile", help="write KFP IR YAML for every pipeline into a folder")
    p.add_argument("--out", default="compiled", help="output folder (default: ./compiled)")
    p.add_argument(
        "--pipeline",
        action="append",
        dest="names",
        metavar="NAME",
        help="compile only this pipeline (repeatable)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="also check cluster placement: GPU steps complete, S3 credentials only from Secrets",
    )
    p.set_defaults(func=cmd_compile)

    p = commands.add_parser("submit", help="send a pipeline to a Kubeflow Pipelines endpoint")
    p.add_argument("pipeline", help="compiled pipeline .yaml or a pipeline name (compiled on the fly)")
    p.add_argument("--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080")
    p.add_argument("--namespace", default=None, help="namespace (multi-user KFP)")
    p.add_argument("--experiment", default="harnessrl", help="experiment name (created if missing)")
    p.add_argument("--run-name", default=None)
    p.add_argument("--token", default=None, help="bearer token (default: $KF_PIPELINES_TOKEN)")
    p.add_argument("--arg", action="append", default=[], metavar="K=V", help="pipeline argument (repeatable)")
    p.add_argument(
        "--pipeline-root", default=None, help="override the pipeline root, e.g. minio://harnessrl/root"
    )
    p.add_argument("--service-account", default=None)
    p.add_argument(
        "--upload",
        action="store_true",
        help="also upload it as a named pipeline (new version if it exists) and run that version",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the endpoint to answer")
    p.set_defaults(func=cmd_submit)

    p = commands.add_parser("run", help="run a pipeline locally with kfp.local in a run directory")
    p.add_argument("pipeline", help="pipeline name (see `harnessrl pipelines`) or compiled .yaml")
    p.add_argument("--run-dir", default=None, help="default: runs/<pipeline>-<UTC time>")
    p.add_argument("--arg", action="append", default=[], metavar="K=V", help="pipeline argument (repeatable)")
    p.add_argument("--no-cache", action="store_true", help="re-execute every step (no kfp.local cache)")
    p.add_argument(
        "--runner",
        choices=list(Runner),
        default=Runner.SUBPROCESS,
        help="subprocess: steps in this Python env; container: each step in the project image via podman "
        "(`make image` first; docs/containers.md)",
    )
    p.set_defaults(func=cmd_run)

    p = commands.add_parser(
        "demo", help="the full pipeline locally on the embedded default (tiny model, small real package)"
    )
    p.add_argument("--run-dir", default=None, help="default: runs/demo-<UTC time>")
    p.add_argument("--max-tasks", type=int, default=4)
    p.add_argument("--source", default=None, help="repo dir or sdist to use instead of parse==1.22.4")
    p.add_argument(
        "--harness",
        default="chat",
        help="the harness the RL step and the evaluation run through: chat (default), or claude-code / codex, "
        "a production CLI in the sandbox (`make cli-agents` first)",
    )
    p.set_defaults(func=cmd_demo)


def cmd_pipelines(args: argparse.Namespace) -> int:
    from pipelines.registry import PIPELINES

    for entry in PIPELINES.values():
        params = ", ".join(sorted(entry.load().component_spec.inputs or {}))
        print(f"{entry.name:16} {entry.summary}\n{'':16} parameters: {params}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all
    from pipelines.registry import get_entry

    for name in args.names or []:
        get_entry(name)  # unknown names: one clear error
    written = compile_all(args.out, args.names)
    for name, path in written.items():
        print(f"compiled {name:16} -> {path}")
    problems: list[str] = []
    if args.check:
        from pipelines.full import S3_STEPS
        from pipelines.spec_checks import CompiledPipeline, placement_problems

        for name, path in written.items():
            problems += [
                f"{name}: {p}" for p in placement_problems(CompiledPipeline.load(path), set(S3_STEPS))
            ]
        print("\n".join(problems) if problems else f"placement checked: {len(written)} pipeline(s) ok")
    return 0 if written and not problems else 1


def cmd_submit(args: argparse.Namespace) -> int:
    from pipelines.submit import SubmitError, submit

    try:
        submitted = submit(
            args.pipeline,
            host=args.host,
            arguments=args.arg,
            namespace=args.namespace,
            experiment=args.experiment,
            run_name=args.run_name,
            token=args.token,
            pipeline_root=args.pipeline_root,
            service_account=args.service_account,
            upload=args.upload,
            timeout_s=args.timeout,
        )
    except SubmitError as e:
        raise UserError(str(e)) from None
    print(f"submitted run {submitted.run_id} ({submitted.run_name}) to {args.host}")
    if submitted.pipeline_version_id:
        print(f"pipeline {submitted.pipeline_id} version {submitted.pipeline_version_id}")
    print(f"run details: {submitted.url}")
    return 0


def print_run_summary(result) -> None:
    from rich.console import Console

    console = Console(soft_wrap=True)
    color = "green" if result.status == "succeeded" else "red"
    console.print(
        f"[{color}]{result.status}[/]"
        + (
            f": step {result.failed_task} failed — its log is in {result.run_dir / 'run.log'}"
            if result.failed_task
            else ""
        )
    )
    if reason := result.failure_reason or (result.error if result.status != "succeeded" else None):
        console.print(reason, highlight=False, markup=False, soft_wrap=True)
    console.print(f"run directory: {result.run_dir}", highlight=False)
    console.print(f"index of outputs: {result.index_path}", highlight=False)
    console.print(f"artifacts: {result.run_dir / 'artifacts'}", highlight=False)
    for path in result.reports[:1]:
        console.print(f"report: {path}", highlight=False)


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.local_run import LocalRunError, Runner, run_local

    try:
        result = run_local(
            args.pipeline, args.arg, args.run_dir, cache=not args.no_cache, runner=Runner(args.runner)
        )
    except LocalRunError as e:
        raise UserError(str(e)) from None
    except KeyboardInterrupt as e:
        print(f"harnessrl: {e}", file=sys.stderr)
        return 130
    print_run_summary(result)
    return 0 if result.status == "succeeded" else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    try:
        result = run_demo(
            run_dir=args.run_dir,
            max_tasks=args.max_tasks,
            source=Path(args.source) if args.source else None,
            harness=args.harness,
        )
    except KeyboardInterrupt as e:
        print(f"harnessrl: {e}", file=sys.stderr)
        return 130
    print_run_summary(result)
    if result.status == "succeeded":
        tasks = json.loads(result.index_path.read_text())["tasks"]
        for label, step, output in (
            ("clean task set", "clean", "kept"),
            ("selected tasks", "select", "selected"),
            ("final checkpoint", "rl-loop", "model"),
            ("rl metrics (TensorBoard)", "rl-loop", "tensorboard"),
            ("evaluation (base vs trained, held out)", "evaluate", "evaluation"),
        ):
            if output in tasks.get(step, {}).get("outputs", {}):
                print(f"{label}: {tasks[step]['outputs'][output]['path']}")
        for name in ("summarize-rl-run.html", "rl-loop.html"):  # kfp.local names reports by component
            if (result.run_dir / "reports" / name).is_file():
                print(f"{name.removesuffix('.html')} report: {result.run_dir / 'reports' / name}")
        evaluation = tasks.get("evaluate", {}).get("outputs", {}).get("evaluation")
        if evaluation is not None:
            from harnessrl.evaluate.results import describe

            saved = json.loads(Path(evaluation["path"]).read_text())  # may hold no results: then a note
            for comparison in saved["comparisons"]:
                print(f"held-out: {describe(comparison)}")
            if "note" in saved:
                print(f"held-out: {saved['note']}")
    return 0 if result.status == "succeeded" else 1
