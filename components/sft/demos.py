"""Scripted demonstrations for the cold-start SFT stage: each task's gold fix, acted out through the REAL
generate path (workspace, sandbox, ReAct harness, gateway, export) and graded by the real verify code.

The "model" is `ScriptedEngine`, a token-level engine served on loopback by the engine server the project
already has (`harnessrl.engine.server`, the vLLM-compatible token API): for each model call it finds the task
by its problem statement in the prompt, counts the demonstration's replies already in the prompt, and answers
the next reply as token ids. Replies are written in the tool-call format the gateway parses (its own
renderer), so the recorded samples hold exactly the chat template, tool-call text and token stream the policy
produces later. The scripted policy is deterministic, so its behavior logprobs are 0 (probability 1).

A demonstration = view the changed region of each file, one `str_replace` per changed region, submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from harnessrl.engine.base import (
    EngineStats,
    FinishReason,
    Generation,
    GenerationDelta,
    SamplingParams,
    StreamingEngine,
)
from harnessrl.gateway.toolcalls import ToolCall, ToolParser, get_parser
from harnessrl.io import read_jsonl
from harnessrl.rollout.specs import NamedSpec
from harnessrl.sandbox.workspace import git, materialize
from harnessrl.schema import HarnessName
from harnessrl.taskset import TaskSet

logger = logging.getLogger(__name__)

VIEW_CONTEXT_LINES = 6  # lines shown around a changed region
EDITOR = "str_replace_editor"


class DemoError(ValueError):
    """A task whose gold fix cannot be acted out with the editor tool (the reason names the task)."""


@dataclass(frozen=True)
class Demonstration:
    instance_id: str
    problem_statement: str
    replies: tuple[str, ...]  # assistant texts, one per model call, tool calls in the gateway's format


@dataclass(frozen=True)
class _Edit:
    path: str
    old: str
    new: str
    first_line: int  # 1-based, in the file before this edit
    last_line: int


def _fix_direction(ws: Path, patch: str) -> list[str]:
    """`git apply` flags that turn the workspace into the fixed code: SWE-bench rows carry the fix, SWE-smith
    rows the bug (the fix is its reverse)."""
    for flags in ([], ["-R"]):
        if git(["apply", "--check", *flags], cwd=ws, input=patch.encode(), check=False).returncode == 0:
            return flags
    raise DemoError("the task's patch applies neither forward nor in reverse to its workspace")


def _unique_old(before: list[str], i1: int, i2: int) -> tuple[int, int]:
    """Widens lines [i1, i2) until they occur exactly once in the file (str_replace needs a unique match)."""
    text = "".join(before)
    lo, hi = i1, i2
    while True:
        old = "".join(before[lo:hi])
        if old and text.count(old) == 1:
            return lo, hi
        if lo == 0 and hi == len(before):
            raise DemoError("no unique region of the file covers the change")
        lo, hi = max(lo - 1, 0), min(hi + 1, len(before))


def _file_edits(path: str, before: str, after: str) -> list[_Edit]:
    """One edit per changed region, applied in order (each against the file as the previous left it)."""
    edits: list[_Edit] = []
    current = before
    while current != after:
        if len(edits) > len(before.splitlines()) + len(after.splitlines()):  # each edit fixes a region
            raise DemoError(f"{path}: the fix does not decompose into str_replace edits")
        cur_lines = current.splitlines(keepends=True)
        new_lines = after.splitlines(keepends=True)
        ops = [op for op in difflib.SequenceMatcher(a=cur_lines, b=new_lines, autojunk=False).get_opcodes()]
        tag, i1, i2, j1, j2 = next(op for op in ops if op[0] != "equal")
        lo, hi = _unique_old(cur_lines, i1, i2)
        old = "".join(cur_lines[lo:hi])
        new = "".join(cur_lines[lo:i1]) + "".join(new_lines[j1:j2]) + "".join(cur_lines[i2:hi])
        edits.append(_Edit(path, old, new, lo + 1, max(hi, lo + 1)))
        current = current.replace(old, new, 1)
    return edits


def _reply(content: str, name: str, arguments: dict[str, Any], tool_format: ToolParser) -> str:
    return content + "\n" + get_parser(tool_format).render([ToolCall(name, arguments)])


def build_demonstration(
    taskset: TaskSet, row: dict, tool_format: ToolParser = ToolParser.HERMES
) -> Demonstration:
    """The replies of a good agent for one task, derived from its gold fix (checked on a scratch workspace)."""
    iid = row["instance_id"]
    scratch = Path(tempfile.mkdtemp(prefix="harnessrl-demo-"))
    try:
        ws = materialize(taskset, iid, scratch / "ws")
        patch = row["patch"]
        git(["apply", *_fix_direction(ws, patch)], cwd=ws, input=patch.encode())
        changed = git(["diff", "--name-only", "-z", "HEAD"], cwd=ws).stdout.decode().split("\0")
        added = git(["ls-files", "-z", "--others", "--exclude-standard"], cwd=ws).stdout.decode().split("\0")
        changed, added = [c for c in changed if c], [a for a in added if a]
        if not changed and not added:
            raise DemoError("the gold fix changes nothing")
        replies: list[str] = []
        for path in changed:
            if not (ws / path).is_file():
                raise DemoError(f"the gold fix deletes {path}; the editor tool cannot delete files")
            before = git(["show", f"HEAD:{path}"], cwd=ws).stdout.decode()
            edits = _file_edits(path, before, (ws / path).read_text())
            first = max(edits[0].first_line - VIEW_CONTEXT_LINES, 1)
            last = edits[0].last_line + VIEW_CONTEXT_LINES
            view = {"command": "view", "path": path, "view_range": [first, last]}
            replies.append(_reply(f"Let me look at `{path}`.", EDITOR, view, tool_format))
            for e in edits:
                args = {"command": "str_replace", "path": path, "old_str": e.old, "new_str": e.new}
                replies.append(_reply(f"I will fix `{path}`.", EDITOR, args, tool_format))
        for path in added:
            args = {"command": "create", "path": path, "file_text": (ws / path).read_text()}
            replies.append(_reply(f"I will create `{path}`.", EDITOR, args, tool_format))
        replies.append(_reply("The fix is done.", "submit", {}, tool_format))
        return Demonstration(iid, row["problem_statement"], tuple(replies))
    except (OSError, UnicodeDecodeError) as e:
        raise DemoError(f"{type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class ScriptedEngine(StreamingEngine):
    """The `Engine` interface answering from demonstrations (see the module docstring); not a model."""

    def __init__(self, demos: list[Demonstration], tokenizer: Any, model_dir: str | Path):
        statements = [d.problem_statement for d in demos]
        if len(set(statements)) != len(statements):
            raise DemoError(
                "two demonstrations share a problem statement; the engine could not tell them apart"
            )
        # longest first, so a statement that contains another one wins
        self.demos = sorted(demos, key=lambda d: -len(d.problem_statement))
        self.tokenizer = tokenizer
        self.model_dir = str(model_dir)
        self.max_context = 1 << 20
        self.policy_version = 0
        self.calls = 0
        self._eos = tokenizer.eos_token_id

    def inflight(self) -> int:
        return 0

    async def stats(self) -> EngineStats:
        return EngineStats.from_figures({"calls": self.calls})

    async def context_length(self) -> int:
        return self.max_context

    def reply_for(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        demo = next((d for d in self.demos if d.problem_statement in text), None)
        if demo is None:
            return "I cannot find the task in this prompt."
        done, pos = 0, 0
        while done < len(demo.replies) and (j := text.find(demo.replies[done], pos)) >= 0:
            done, pos = done + 1, j + len(demo.replies[done])
        return demo.replies[min(done, len(demo.replies) - 1)]

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        **_: Any,
    ) -> Generation:
        self.calls += 1
        ids = list(self.tokenizer.encode(self.reply_for(prompt_ids), add_special_tokens=False))
        ids.append(stop_token_ids[0] if stop_token_ids else self._eos)
        finish = FinishReason.STOP if len(ids) <= max_tokens else FinishReason.LENGTH
        ids = ids[:max_tokens]
        return Generation(ids, [0.0] * len(ids), finish, 0, token_policy_versions=[0] * len(ids))

    async def generate_stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        **_: Any,
    ) -> AsyncIterator[GenerationDelta]:
        gen = await self.generate(prompt_ids, sampling, max_tokens, stop_token_ids)
        yield GenerationDelta(gen.token_ids, gen.logprobs, gen.token_policy_versions, gen.finish_reason)


class ScriptedEngineServer:
    """Serves a `ScriptedEngine` with `harnessrl.engine.server` on loopback; a context manager → base URL."""

    def __init__(self, engine: ScriptedEngine):
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> str:
        from harnessrl.engine.local import LocalEngine
        from harnessrl.engine.server import serve

        loop = asyncio.new_event_loop()
        self._loop = loop
        ready: asyncio.Future[str] = loop.create_future()
        # the server only uses the Engine interface and the attributes ScriptedEngine has
        self._task = loop.create_task(
            serve(cast(LocalEngine, self.engine), "127.0.0.1", 0, "scripted", ready)
        )
        self._thread = threading.Thread(target=loop.run_forever, name="scripted-engine", daemon=True)
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(30)

    def __exit__(self, *exc: Any) -> None:
        loop, task = self._loop, self._task
        if loop is None or task is None:
            return
        asyncio.run_coroutine_threadsafe(_cancel(task), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()


async def _wait(fut: asyncio.Future[str]) -> str:
    return await fut


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclass
class DemoRun:
    """What `run_demonstrations` produced: generate's and verify's output directories, and per task why not."""

    rollouts: Path  # generate's output (samples.parquet, rollouts.jsonl, ...)
    verified: Path  # verify's output (rewards.jsonl, ...)
    built: list[str]
    skipped: dict[str, str]  # instance_id -> why no demonstration was built
    resolved: list[str]  # instance ids whose demonstration verified as resolved


def check_demo_spec(spec: NamedSpec) -> None:
    tools = set(spec.spec.tools)
    if spec.spec.harness is not HarnessName.REACT or not {"submit"} <= tools or not tools & {"edit", EDITOR}:
        raise ValueError(
            f"harness spec {spec.name!r}: demonstrations are scripted for the react harness with the edit "
            "and submit tools; give such a spec (the default spec has them)"
        )


def run_demonstrations(
    tasks: str | Path,
    out: str | Path,
    policy: str | Path,
    *,
    specs: list[NamedSpec] | str | Path | None = None,
    instance_ids: list[str] | None = None,
    concurrency: int = 2,
    verify_workers: int = 2,
    allow_unsandboxed: bool = False,
    seed: int = 0,
    tool_parser: ToolParser | None = None,
) -> DemoRun:
    """One scripted rollout per task through generate (harness + gateway + sandbox), then verify.

    `policy` gives the tokenizer (the recorded token stream is the policy's); `out` gets `rollouts/` and
    `verified/` in the generate and verify stages' formats, so SFT reads them like any earlier run.
    """
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource, resolve_tool_parser
    from harnessrl.rollout.specs import load_specs
    from harnessrl.tinymodel import load_tokenizer
    from harnessrl.verify.rollouts import run_verify

    out = Path(out)
    taskset = TaskSet.open(tasks)
    named = specs if isinstance(specs, list) else load_specs(specs)
    for spec in named:
        check_demo_spec(spec)
    rows = taskset.rows()
    if instance_ids is not None:
        wanted = set(instance_ids)
        rows = [r for r in rows if r["instance_id"] in wanted]
    tokenizer = load_tokenizer(policy)
    parser = resolve_tool_parser(tool_parser, tokenizer, Path(policy))
    demos: list[Demonstration] = []
    skipped: dict[str, str] = {}
    for row in rows:
        try:
            demos.append(build_demonstration(taskset, row, parser))
        except DemoError as e:
            skipped[row["instance_id"]] = str(e)
            logger.warning("task %s: no demonstration: %s", row["instance_id"], e)
    built = [d.instance_id for d in demos]
    rollouts, verified = out / "rollouts", out / "verified"
    if not demos:
        raise DemoError(f"{taskset.tasks_path}: no task has a demonstration: {skipped}")
    engine = ScriptedEngine(demos, tokenizer, policy)
    cfg = GenerateConfig(
        group_size=1,
        concurrency=concurrency,
        instance_ids=built,
        allow_unsandboxed=allow_unsandboxed,
        seed=seed,
    )
    with ScriptedEngineServer(engine) as url:
        run_generate(
            tasks,
            rollouts,
            named,
            ModelSource(checkpoint=str(policy), engine_url=url, tool_parser=parser),
            cfg,
        )
    run_verify(Path(tasks), rollouts, verified, workers=verify_workers)
    rewards = read_jsonl(verified / "rewards.jsonl")
    resolved = sorted({str(r["instance_id"]) for r in rewards if (r.get("reward") or 0) >= 1.0})
    logger.info("demonstrations: %d built, %d resolved, %d skipped", len(built), len(resolved), len(skipped))
    return DemoRun(rollouts, verified, built, skipped, resolved)
