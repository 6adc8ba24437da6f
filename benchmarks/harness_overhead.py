"""What a production CLI agent costs as a training harness, per CLI: Claude Code, Codex, and our ReAct loop as the
baseline, each in a real bubblewrap sandbox behind the real gateway, driven by a scripted engine (model time ~0:
the figures are the harness's own).

Per CLI (each run a fresh sandbox and gateway session, after one warm-up run, `--repeats` times, medians):
  - start-up: an episode of one model call (the engine answers "Done." at once): the harness's wall time less
    the engine's — sandbox start, the CLI's start-up, its first request, its exit;
  - overhead per turn: an episode of `--turns` model calls, each but the last a trivial command (`true`) the CLI
    runs in the sandbox: (wall(N) - wall(1)) / (N - 1), less the engine's time per turn (`model_s_per_turn`,
    reported beside it: ~0 here);
  - its first prompt in the policy's tokens, and the journal bytes per call of these runs.
Journal bytes per call at a 1k- and a 30k-token history, per API (OpenAI chat: ReAct; Anthropic Messages: Claude
Code; OpenAI Responses: Codex), against the gateway's fast engine: a first call with a history of that size,
then extending calls with one short tool result each; the journal grows by each call's delta, not its history.
A CLI that is not installed (`make cli-agents`) is reported as skipped with the reason.

    .venv/bin/python benchmarks/harness_overhead.py [--turns 6] [--repeats 3] [--histories 1000,30000] [--smoke]

`--smoke`: the same code path at its smallest (1 repeat, 2 turns, histories of 1k and 4k tokens; the keys keep
their names); the figures mean nothing. The last line printed is one JSON object: `startup_s`,
`overhead_s_per_turn`, `model_s_per_turn`, `first_prompt_tokens`, `journal_bytes_per_call` (the CLI runs),
`journal_bytes_per_call_1k`, `journal_bytes_per_call_30k` (per CLI, at those histories), `versions`, `skipped`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLIS = ("claude-code", "codex", "react")
API_OF = {"claude-code": "anthropic", "codex": "responses", "react": "openai"}
SONNET = {"main": "claude-sonnet-4-6", "fast": "claude-haiku-4-5", "subagent": "claude-haiku-4-5"}
WALL_S = 120.0


def _task(work: Path) -> tuple[Any, dict]:
    from dataprep.synthesize import synthesize_taskset
    from harnessrl.taskset import TaskSet

    out = work / "tasks"
    synthesize_taskset(REPO / "tests" / "fixtures" / "minirepo", out, max_tasks=1, seed=0)
    ts = TaskSet.open(out)
    return ts, ts.rows()[0]


def _script(cli: str, turns: int) -> tuple[tuple[str, ...], Any]:
    """The replies of an episode of `turns` model calls (each but the last runs `true`), and its harness."""
    from harnessrl.harness.claude_code import ClaudeCodeConfig, ClaudeCodeHarness
    from harnessrl.harness.codex import CodexConfig, CodexHarness
    from harnessrl.harness.react import ReActConfig, ReActHarness
    from tests.support.claude_code import call

    if cli == "claude-code":
        work = call("Bash", command="true", description="Nothing")
        config = ClaudeCodeConfig(
            max_turns=turns + 2, wall_s=WALL_S, tools=["Bash", "Read", "Edit"], models=SONNET
        )
        return (*[work] * (turns - 1), "Done."), ClaudeCodeHarness(config)
    if cli == "codex":
        work = call("exec_command", cmd="true")
        config = CodexConfig(max_turns=turns + 2, wall_s=WALL_S, model="gpt-5.1-codex-max")
        return (*[work] * (turns - 1), "Done."), CodexHarness(config)
    work = call("bash", command="true")
    react = ReActConfig.from_spec(["bash", "submit"], {"turns": turns + 2, "wall_s": WALL_S}, {})
    return (*[work] * (turns - 1), call("submit")), ReActHarness(react)


def _episode(cli: str, turns: int, ts: Any, row: dict, work: Path, tokenizer: Any) -> dict[str, float]:
    """One episode in a fresh sandbox behind a fresh gateway: its wall time, the engine's, the calls, the first
    prompt's tokens, the journal's bytes."""
    from components.sft.demos import Demonstration, ScriptedEngineServer
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
    from harnessrl.gateway.journal import journal_file
    from harnessrl.harness.base import Endpoint, TaskPrompt
    from harnessrl.harness.runtime import SandboxRuntime
    from harnessrl.sandbox.bwrap import BubblewrapSandbox
    from harnessrl.sandbox.workspace import materialize
    from harnessrl.tinymodel import tiny_model_dir
    from tests.gateway.support import call_records
    from tests.support.claude_code import CliScriptEngine

    replies, harness = _script(cli, turns)
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"{cli}-"))
    ws = materialize(ts, row["instance_id"], run_dir / "ws")
    engine = CliScriptEngine(
        [Demonstration(row["instance_id"], row["problem_statement"], replies)],
        tokenizer,
        tiny_model_dir(),
        True,
    )
    with ScriptedEngineServer(engine) as url:
        gateway = GatewayServer(
            HTTPEngine(url), tokenizer, run_dir / "journal", "adm", config=GatewayConfig(max_model_len=65536)
        )
        admin = GatewayAdmin(gateway.start(), "adm")
        try:
            session = admin.create_session("r0", row["instance_id"])
            sandbox = BubblewrapSandbox(ws, None)
            try:
                t0 = time.perf_counter()
                res = harness.run(
                    TaskPrompt(row["instance_id"], row["problem_statement"]),
                    Endpoint(session.openai_base_url, session.api_key),
                    SandboxRuntime(sandbox, ws),
                )
                wall = time.perf_counter() - t0
            finally:
                sandbox.close()
        finally:
            gateway.stop()
    if str(res.status) != "ok":
        raise RuntimeError(f"{cli}: the episode ended {res.status} / {res.finish_reason}: {res.error}")
    recs = call_records(run_dir / "journal")
    if len(recs) != turns:
        raise RuntimeError(f"{cli}: {len(recs)} model calls, expected {turns}")
    return {
        "wall_s": wall,
        "engine_s": sum(r.timings.engine_s for r in recs),
        "calls": len(recs),
        "first_prompt_tokens": recs[0].timings.prompt_tokens,
        "journal_bytes": journal_file(run_dir / "journal").stat().st_size,
    }


def measure_cli(cli: str, turns: int, repeats: int, ts: Any, row: dict, work: Path, tokenizer: Any) -> dict:
    ones: list[dict] = []
    manys: list[dict] = []
    _episode(cli, 1, ts, row, work, tokenizer)  # warm-up (page cache, the CLI's first start): not counted
    for _ in range(repeats):  # interleaved: load changes hit both alike
        ones.append(_episode(cli, 1, ts, row, work, tokenizer))
        manys.append(_episode(cli, turns, ts, row, work, tokenizer))
    med = statistics.median
    model_per_turn = med(
        [(m["engine_s"] - o["engine_s"]) / (turns - 1) for o, m in zip(ones, manys, strict=True)]
    )
    per_turn = med([(m["wall_s"] - o["wall_s"]) / (turns - 1) for o, m in zip(ones, manys, strict=True)])
    return {
        "startup_s": med([o["wall_s"] - o["engine_s"] for o in ones]),
        "overhead_s_per_turn": per_turn - model_per_turn,
        "model_s_per_turn": model_per_turn,
        "first_prompt_tokens": manys[0]["first_prompt_tokens"],
        "journal_bytes_per_call": med([m["journal_bytes"] / m["calls"] for m in manys]),
    }


# -- journal bytes per call at a given history, per API ---------------------------------------------------------
TOOL = {"name": "bash", "description": "run a shell command"}
PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def _post(url: str, body: dict, key: str) -> dict:
    req = urllib.request.Request(
        url,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}", "x-api-key": key},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _history_text(tokenizer: Any, tokens: int) -> str:
    line = "def helper_{i}(value):  # a line of a file the agent read\n"
    text, i = "", 0
    while len(tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += "".join(line.format(i=i + k) for k in range(50))
        i += 50
    return text


def journal_bytes_per_call(
    api: str, history_tokens: int, tokenizer: Any, work: Path, extends: int = 3
) -> float:
    """Median journal bytes of a call that extends a chain whose history holds ~`history_tokens` tokens."""
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
    from harnessrl.gateway.journal import journal_file
    from tests.support.fast_engine import TOOL_REPLY, FastEngineServer

    fast = FastEngineServer(tokenizer, [{"text": TOOL_REPLY}], select="hash")
    fast.start()
    journal = Path(tempfile.mkdtemp(dir=work, prefix=f"journal-{api}-"))
    gateway = GatewayServer(
        HTTPEngine(fast.base_url), tokenizer, journal, "adm", config=GatewayConfig(max_model_len=131072)
    )
    try:
        admin = GatewayAdmin(gateway.start(), "adm")
        s = admin.create_session("r", "t")
        task = "Fix the bug. Here is the file:\n" + _history_text(tokenizer, history_tokens)
        sizes: list[int] = []
        if api == "openai":
            messages: list[dict] = [{"role": "user", "content": task}]
            tools = [{"type": "function", "function": {**TOOL, "parameters": PARAMS}}]
            for i in range(extends + 1):
                before = journal_file(journal).stat().st_size
                msg = _post(
                    f"{s.openai_base_url}/chat/completions",
                    {"model": "m", "messages": messages, "tools": tools},
                    s.api_key,
                )["choices"][0]["message"]
                sizes.append(journal_file(journal).stat().st_size - before)
                messages.append(
                    {k: msg[k] for k in ("role", "content", "tool_calls") if msg.get(k) is not None}
                )
                messages.append(
                    {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"result {i}"}
                )
        elif api == "anthropic":
            messages = [{"role": "user", "content": task}]
            tools = [{**TOOL, "input_schema": PARAMS}]
            for i in range(extends + 1):
                before = journal_file(journal).stat().st_size
                reply = _post(
                    f"{s.anthropic_base_url}/v1/messages",
                    {"model": "m", "max_tokens": 256, "messages": messages, "tools": tools},
                    s.api_key,
                )
                sizes.append(journal_file(journal).stat().st_size - before)
                use = next(b for b in reply["content"] if b["type"] == "tool_use")
                messages.append({"role": "assistant", "content": reply["content"]})
                messages.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use["id"], "content": f"result {i}"}
                        ],
                    }
                )
        else:
            items: list[dict] = [{"type": "message", "role": "user", "content": task}]
            tools = [{"type": "function", **TOOL, "parameters": PARAMS}]
            for i in range(extends + 1):
                before = journal_file(journal).stat().st_size
                reply = _post(
                    f"{s.openai_base_url}/responses",
                    {"model": "m", "input": items, "tools": tools},
                    s.api_key,
                )
                sizes.append(journal_file(journal).stat().st_size - before)
                call = next(o for o in reply["output"] if o["type"] == "function_call")
                items += reply["output"] + [
                    {"type": "function_call_output", "call_id": call["call_id"], "output": f"result {i}"}
                ]
        ops = _ops(journal)
        if ops != ["new", *["extend"] * extends]:
            raise RuntimeError(f"{api}: the calls did not extend one chain: {ops}")
        return statistics.median(sizes[1:])
    finally:
        gateway.stop()
        fast.stop()


def _ops(journal: Path) -> list[str]:
    from tests.gateway.support import call_records

    return [r.op.value for r in call_records(journal)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--histories", default="1000,30000", help="history sizes in tokens: the 1k and 30k figures"
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.turns, args.repeats, args.histories = 2, 1, "1000,4000"
    if args.turns < 2:
        parser.error("--turns must be >= 2")
    short, long_ = (int(x) for x in args.histories.split(","))

    from harnessrl.harness.cli_agents import CLAUDE_CODE, CODEX, PINNED, skip_reason
    from harnessrl.light_tokenizer import load_gateway_tokenizer

    tokenizer = load_gateway_tokenizer()
    out: dict[str, Any] = {k: {} for k in ("startup_s", "overhead_s_per_turn", "model_s_per_turn")}
    out.update(first_prompt_tokens={}, journal_bytes_per_call={}, journal_bytes_per_call_1k={})
    out.update(journal_bytes_per_call_30k={}, versions={}, skipped={}, history_tokens=[short, long_])
    out.update(turns=args.turns, repeats=args.repeats)
    with tempfile.TemporaryDirectory(prefix="harness-overhead-") as tmp:
        work = Path(tmp)
        ts, row = _task(work)
        for cli in CLIS:
            for key, tokens in (("journal_bytes_per_call_1k", short), ("journal_bytes_per_call_30k", long_)):
                out[key][cli] = journal_bytes_per_call(API_OF[cli], tokens, tokenizer, work)
            name = {"claude-code": CLAUDE_CODE, "codex": CODEX}.get(cli)
            why = skip_reason(name) if name else None
            if why is not None:
                out["skipped"][cli] = why
                print(f"{cli}: skipped: {why}", flush=True)
                continue
            out["versions"][cli] = PINNED[name][1] if name else "ours"
            t0 = time.perf_counter()
            figures = measure_cli(cli, args.turns, args.repeats, ts, row, work, tokenizer)
            for key, value in figures.items():
                out[key][cli] = value
            print(f"{cli}: {json.dumps(figures)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
