"""For the tests of the CLI-agent harnesses (harnessrl/harness/cli_episode.py: Claude Code, Codex).

`StandIn`: a shell script at the pinned install's place (no npm), run as a CLI's harness in the real bubblewrap
sandbox. `cli_rollouts`: rollouts of the real CLI through a real gateway in front of a scripted engine
(tests/support/claude_code.py's `CliScriptEngine`: not a model), each in a bubblewrap sandbox of its own on a
task's workspace. `generate_two_tasks`: the generate stage on two minirepo tasks, scripted to fix one (reward
1) and to break the other (reward 0), and what every CLI's run of it must show.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from components.sft.demos import Demonstration, ScriptedEngineServer
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from harnessrl.harness.base import Endpoint, HarnessResult, TaskPrompt
from harnessrl.harness.cli_agents import MANIFEST, PINNED, prefix_for
from harnessrl.harness.cli_episode import CliConfig, CliHarness
from harnessrl.harness.runtime import SandboxRuntime
from harnessrl.io import read_jsonl
from harnessrl.sandbox.base import AgentSandbox
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.taskset import TaskSet
from harnessrl.tinymodel import tiny_model_dir
from tests.support.claude_code import CliScriptEngine

ENDPOINT = Endpoint("http://127.0.0.1:9/sessions/s-1/v1", "key")  # nothing listens: the stand-ins' calls fail
TASK = TaskPrompt("t", "Fix the bug.")
WALL_S = 180  # for the real CLIs


class StandIn:
    """`install(script)` puts `script` where `config`'s pinned CLI would be (HARNESSRL_CACHE in tmp);
    `run(**options)` runs one episode of it in a fresh bubblewrap sandbox on a one-file workspace."""

    def __init__(self, config: type[CliConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "cache"))
        self.config, self.prefix = config, prefix_for(config.tool)
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()
        (self.workspace / "a.py").write_text("x = 1\n")
        self.sandboxes: list[BubblewrapSandbox] = []

    def install(self, script: str) -> None:
        tool = self.config.tool
        exe = self.prefix / "bin" / tool
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n" + script + "\n")
        exe.chmod(0o755)
        manifest = {"name": tool, "version": PINNED[tool][1], "executable": f"bin/{tool}"}
        (self.prefix / MANIFEST).write_text(json.dumps(manifest))
        self.prefix.chmod(0o755)

    def run(self, **options: Any) -> HarnessResult:
        self.sandboxes.append(BubblewrapSandbox(self.workspace, None))
        harness = CliHarness(self.config(**{"wall_s": 60.0, **options}))
        return harness.run(TASK, ENDPOINT, SandboxRuntime(self.sandboxes[-1], self.workspace))

    def close(self) -> None:
        for s in self.sandboxes:
            s.close()


def one_line_change(patch: str) -> tuple[str, str, str] | None:
    """(path, line before, line after) of a patch that changes exactly one line, indentation kept."""
    lines = patch.splitlines()
    minus = [x[1:] for x in lines if x.startswith("-") and not x.startswith("---")]
    plus = [x[1:] for x in lines if x.startswith("+") and not x.startswith("+++")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    path = next(x[len("+++ b/") :] for x in lines if x.startswith("+++ b/"))
    return path, minus[0], plus[0]


def generate_two_tasks(
    harness: str,
    script: Callable[[str, str, str], tuple[str, ...]],
    options: dict,
    taskset: Path,
    tokenizer: Any,
    tmp_path: Path,
    capsys: Any,
    sandboxes: tuple[str, str] = ("bubblewrap", "bubblewrap-strict"),
) -> tuple[Path, dict[str, dict], list[dict], str]:
    """`harnessrl stage generate --specs '[{"harness": harness, ...}]'` on two minirepo tasks whose bug patches
    change one line, two rollouts each under the CLI's defaults (spec `default`, in `sandboxes[0]`) and under
    `options` (spec `options`, in `sandboxes[1]`; by default the strict sandbox), against the scripted engine: `script(path, buggy line, fixed line)` fixes one task,
    a wrong edit of the other does not. Each of the 4 rollouts runs the 4-turn script to its end in one chain (no
    rollback, nothing discarded); the records hold exactly the sampled tokens, the samples train exactly those;
    verify rewards the fix 1, the wrong edit 0. Returns the stage's output dir, its rollouts by id, its records
    and the fixed task's id."""
    from harnessrl.cli import main
    from harnessrl.verify.rollouts import run_verify

    rows = [r for r in TaskSet.open(taskset).rows() if one_line_change(r["patch"])]
    assert len(rows) >= 2, "the minirepo task set must have two single-line fixes"
    good, bad = rows[0], rows[1]
    fix, wrong = one_line_change(good["patch"]), one_line_change(bad["patch"])
    assert fix and wrong
    demos = [  # the bug patch's "+" line is the bug: the fix puts its "-" line back
        Demonstration(good["instance_id"], good["problem_statement"], script(fix[0], fix[2], fix[1])),
        Demonstration(
            bad["instance_id"], bad["problem_statement"], script(wrong[0], wrong[2], wrong[2] + "  # ok")
        ),
    ]
    engine = CliScriptEngine(demos, tokenizer, tiny_model_dir())
    limits = {"turns": 8, "wall_s": WALL_S}
    specs = [
        {"name": "default", "harness": harness, "sandbox": sandboxes[0], "limits": limits},
        {
            "name": "options",
            "harness": harness,
            "sandbox": sandboxes[1],
            "limits": limits,
            "options": options,
        },
    ]
    out = tmp_path / "gen"
    with ScriptedEngineServer(engine) as url:
        args = ["stage", "generate", "--tasks", str(taskset), "--out", str(out), "--specs", json.dumps(specs)]
        args += ["--engine-url", url, "--group-size", "2", "--concurrency", "2"]
        assert main([*args, "--instance-ids", good["instance_id"], bad["instance_id"]]) == 0
    metrics = json.loads(capsys.readouterr().out)
    rollouts = {r["rollout_id"]: r for r in read_jsonl(out / "rollouts.jsonl")}
    assert len(rollouts) == 4
    for r in rollouts.values():
        assert (r["rollout_status"], r["finish_reason"], r["error"]) == ("ok", "submitted", ""), r
        assert (r["turns"], r["tool_calls"]) == (4, 3)
        assert r["gateway"]["rollbacks"] == 0 and r["gateway"]["discarded_trainable"] == 0
        assert r["gateway"]["chains"] == 1
    assert metrics["single_sample_share"] == 1.0 and metrics["samples_per_rollout_mean"] == 1.0
    assert "Samples per rollout" in (out / "report.md").read_text()

    records = pq.read_table(out / "records.parquet").to_pylist()
    # the tokens are exactly what the engine sampled: one record per engine call, the same ids
    assert sorted(map(tuple, engine.sampled)) == sorted(tuple(c["completion_ids"]) for c in records)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    scripted = {
        tuple(tokenizer.encode(t, add_special_tokens=False) + [eot]) for d in engine.demos for t in d.replies
    }
    assert {tuple(c["completion_ids"]) for c in records} <= scripted
    for s in pq.read_table(out / "samples.parquet").to_pylist():
        calls = sorted(
            (c for c in records if c["rollout_id"] == s["rollout_id"]), key=lambda c: c["started_at"]
        )
        trained = [t for t, m in zip(s["input_ids"], s["loss_mask"], strict=True) if m]
        assert trained == [t for c in calls for t in c["completion_ids"]]  # masks cover only sampled tokens
        assert all(lp == 0.0 for lp, m in zip(s["behavior_logprobs"], s["loss_mask"], strict=True) if m)
        assert s["input_ids"][: len(calls[-1]["prompt_ids"])] == calls[-1]["prompt_ids"]

    run_verify(taskset, out, tmp_path / "verified", workers=2)
    rewards = {r["rollout_id"]: r["reward"] for r in read_jsonl(tmp_path / "verified" / "rewards.jsonl")}
    for rid, r in rollouts.items():
        assert rewards[rid] == (1.0 if r["instance_id"] == good["instance_id"] else 0.0), (rid, rewards)
    return out, rollouts, records, good["instance_id"]


class CliRollout:
    """Rollouts of a CLI's harness by hand: a gateway in front of the scripted engine, a session, bubblewrap
    sandboxes on a task's workspace."""

    def __init__(
        self,
        config: type[CliConfig],
        task,
        engine: CliScriptEngine,
        tmp_path: Path,
        tokenizer,
        max_model_len: int,
        make_sandbox: Callable[[Path], AgentSandbox] | None = None,
        reply_tokens: int | None = None,
        context_tokens: int | None = None,
    ):
        self.config = config
        self.make_sandbox = make_sandbox or (lambda ws: BubblewrapSandbox(ws, None))
        tmp_path = Path(tempfile.mkdtemp(dir=tmp_path, prefix="rollout-"))  # a test may make several
        self.server = ScriptedEngineServer(engine)
        url = self.server.__enter__()
        gateway_config = GatewayConfig(max_model_len=max_model_len)
        self.gateway = GatewayServer(
            HTTPEngine(url), tokenizer, tmp_path / "journal", "adm", config=gateway_config
        )
        self.admin = GatewayAdmin(self.gateway.start(), "adm")
        self.session = self.admin.create_session(
            "r0", task.iid, reply_tokens=reply_tokens, context_tokens=context_tokens
        )
        self.workspace = task.workspace(tmp_path / "ws")
        self.secret = tmp_path / "host-secret.txt"
        self.sandboxes: list[AgentSandbox] = []

    def run(self, task, options: dict, base_url: str | None = None) -> HarnessResult:
        """One episode in a sandbox of its own (as each rollout has)."""
        self.sandboxes.append(self.make_sandbox(self.workspace))
        harness = CliHarness(self.config(**{"wall_s": WALL_S, **options}))
        endpoint = Endpoint(base_url or self.session.openai_base_url, self.session.api_key)
        return harness.run(
            TaskPrompt(task.iid, task.row["problem_statement"]),
            endpoint,
            SandboxRuntime(self.sandboxes[-1], self.workspace),
        )

    def escape_probe(self, also: str = "") -> str:
        """A command that tries what the sandbox must refuse (a host file, /root, the gateway's TCP port, the
        internet) and prints its uid, with `also` after that: `assert_refused` reads its output."""
        self.secret.write_text("HOST-ONLY")
        port = urlsplit(self.admin.base_url).port
        return (
            f"cat {self.secret} 2>&1; ls /root 2>&1 | head -1; id -u; {also}"
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" 2>&1 | tail -1; "
            "python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\" 2>&1 | tail -1"
        )

    def records(self):
        from tests.gateway.support import call_records

        return call_records(self.gateway.journal_dir)

    def close(self) -> None:
        for sandbox in self.sandboxes:
            sandbox.close()
        self.gateway.stop()
        self.server.__exit__(None, None, None)


def assert_refused(out: str) -> None:
    """`CliRollout.escape_probe`'s output: no host file, uid 1000, both connections failed."""
    assert "HOST-ONLY" not in out and "No such file" in out
    assert "\n1000\n" in f"\n{out}\n"
    assert out.count("Error") >= 2 or out.count("error") >= 2, out


@contextlib.contextmanager
def cli_rollouts(
    config: type[CliConfig],
    task,
    tokenizer,
    tmp_path: Path,
    make_sandbox: Callable[[Path], AgentSandbox] | None = None,
) -> Iterator[Callable[..., tuple[CliRollout, CliScriptEngine]]]:
    """make(replies, max_model_len=65536, reply_tokens=None, context_tokens=None) -> a CliRollout of `config`'s
    CLI on `task` and its engine, which answers `replies` in order (stateful), in sandboxes
    `make_sandbox(workspace)` makes (default bubblewrap), its session's calls held to `reply_tokens` and a
    window of `context_tokens`; all closed at the end."""
    made: list[CliRollout] = []

    def make(
        replies: tuple[str, ...],
        max_model_len: int = 65536,
        reply_tokens: int | None = None,
        context_tokens: int | None = None,
    ) -> tuple[CliRollout, CliScriptEngine]:
        demo = Demonstration(task.iid, task.row["problem_statement"], replies)
        engine = CliScriptEngine([demo], tokenizer, tiny_model_dir(), stateful=True)
        made.append(
            CliRollout(
                config,
                task,
                engine,
                tmp_path,
                tokenizer,
                max_model_len,
                make_sandbox,
                reply_tokens,
                context_tokens,
            )
        )
        return made[-1], engine

    try:
        yield make
    finally:
        for r in made:
            r.close()
