"""Rollout records you can trust when the data or the agent misbehaves: an instance id that is a path, and
an agent that leaves a diff too large to keep. Real gateway, bubblewrap, ReAct harness, fast engine."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import cast

import pytest

from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.workspace import MAX_PATCH_BYTES, safe_name
from harnessrl.taskset import TaskSet, bundle_name
from tests.support.fixtures import requires_bwrap

PATH_LIKE_ID = "evil/nested/id"  # a valid git branch name, and a path


def _taskset_with_path_like_id(src: Path, dest: Path) -> dict:
    """A copy of the task set with one task re-published under PATH_LIKE_ID (branch and row)."""
    shutil.copytree(src, dest)
    ts = TaskSet.open(dest)
    row = ts.rows()[0]
    bundle = dest / "repos" / bundle_name(row["repo"])
    repo = dest / "clone.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(bundle), str(repo)], check=True)
    subprocess.run(["git", "--git-dir", str(repo), "branch", PATH_LIKE_ID, row["instance_id"]], check=True)
    subprocess.run(
        ["git", "--git-dir", str(repo), "bundle", "create", "-q", str(bundle), "--all"], check=True
    )
    shutil.rmtree(repo)
    evil = dict(row, instance_id=PATH_LIKE_ID)
    write_jsonl(ts.tasks_path, [*ts.rows(), evil])
    return evil


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@requires_bwrap
def test_path_like_instance_id_and_a_diff_over_the_cap(synth_taskset, fast_engine, tmp_path):
    _taskset_with_path_like_id(synth_taskset, tmp_path / "tasks")
    noise_mb = (MAX_PATCH_BYTES >> 20) + 2
    engine = fast_engine(
        [
            {"text": tool_call("bash", command=f"head -c {noise_mb}M /dev/urandom > noise.bin && echo ok")},
            {"text": tool_call("submit")},
        ]
    )
    specs = parse_specs(
        [{"name": "react", "harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 4}}]
    )
    out = tmp_path / "gen"
    run_generate(
        tmp_path / "tasks",
        out,
        specs,
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=1, concurrency=1, instance_ids=[PATH_LIKE_ID]),
    )
    (row,) = read_jsonl(out / "rollouts.jsonl")
    assert row["rollout_id"] == f"{PATH_LIKE_ID}__r0"
    assert row["rollout_status"] == "patch_too_large" and row["finish_reason"] == "submitted", row["error"]
    assert row["model_patch"] == "" and str(MAX_PATCH_BYTES) in row["error"]
    assert (out / "rollouts.jsonl").stat().st_size < 1 << 20
    transcripts = sorted(p.relative_to(out / "transcripts") for p in (out / "transcripts").rglob("*"))
    assert transcripts == [Path(f"{safe_name(row['rollout_id'])}.json")], transcripts


def test_a_chat_spec_that_names_no_limits_gets_a_reply_budget_a_run_moves_at():
    """HarnessSpec's 8,192 tokens are a tool loop's context; as `chat`'s reply budget they let the tiny model
    sample for minutes per reply (rollout/specs.py DEFAULT_LIMITS)."""
    from harnessrl.rollout.specs import parse_specs

    [chat] = parse_specs([{"harness": "chat"}])
    assert chat.spec.limits == {"tokens": 256, "wall_s": 600}
    [short] = parse_specs([{"harness": "chat", "limits": {"tokens": 64}}])
    assert short.spec.limits == {"tokens": 64, "wall_s": 600}
    [react] = parse_specs([{"harness": "react"}])
    assert react.spec.limits == {"turns": 20, "tokens": 8192, "wall_s": 600}


USED = {
    "react": {"turns": 3, "tokens": 4096, "reply_tokens": 64, "context_tokens": 4096, "wall_s": 60},
    "mini-swe-agent": {"turns": 3, "reply_tokens": 64, "context_tokens": 900, "tool_timeout_s": 10},
    "chat": {"tokens": 64, "reply_tokens": 64, "context_tokens": 512, "wall_s": 60},
    "claude-code": {"turns": 3, "reply_tokens": 64, "context_tokens": 2048, "wall_s": 60},
    "codex": {"turns": 3, "reply_tokens": 64, "context_tokens": 4096, "wall_s": 60},
}
UNUSED = [("chat", "turns", "one model call"), ("chat", "tool_timeout_s", "chat runs no commands")] + [
    (cli, "tokens", "a window per rollout is context_tokens, per model call reply_tokens")
    for cli in ("claude-code", "codex", "mini-swe-agent")
]


def test_each_harness_takes_the_limits_it_uses_and_refuses_the_rest_saying_what_it_does_instead():
    for harness, limits in USED.items():
        [spec] = parse_specs([{"harness": harness, "limits": limits}])
        assert all(spec.spec.limits[k] == v for k, v in limits.items()), harness
    for harness, key, instead in UNUSED:
        try:
            parse_specs([{"harness": harness, "limits": {key: 8}}])
        except ValueError as e:
            assert str(e).startswith(f"harness spec[0].limits.{key}: harness {harness} does not use it ("), e
            assert instead in str(e) and "\n" not in str(e), e
        else:
            raise AssertionError(f"{harness} took limits.{key}")


def test_a_limit_reaches_its_harness_typed_and_an_option_that_would_set_it_is_refused():
    """One mapping per harness (its config's LIMITS): the spec's limit lands in the config field, as its type;
    setting that field through `options` instead is refused naming the limit."""
    from harnessrl.harness.chat import ChatHarness
    from harnessrl.harness.mini_swe_agent import MiniSweAgentHarness
    from harnessrl.harness.react import ReActHarness
    from harnessrl.rollout.specs import build_harness

    [react] = parse_specs({"harness": "react", "limits": {"turns": 3, "tokens": 2048, "tool_timeout_s": 7}})
    config = cast(ReActHarness, build_harness(react.spec)).config
    assert (config.max_turns, config.max_context_tokens, config.tool_timeout_s) == (3, 2048, 7.0)
    assert isinstance(config.tool_timeout_s, float)
    [mini] = parse_specs({"harness": "mini-swe-agent", "limits": {"turns": 2, "wall_s": 30}})
    assert cast(MiniSweAgentHarness, build_harness(mini.spec)).config.step_limit == 2
    [chat] = parse_specs({"harness": "chat", "limits": {"tokens": 77}})
    assert cast(ChatHarness, build_harness(chat.spec)).config.max_tokens == 77
    for harness, option, limit in (("react", "max_turns", "turns"), ("chat", "max_tokens", "tokens")):
        with pytest.raises(ValueError, match=rf"\['{option}'\].*\(set limits\.{limit} instead\)"):
            parse_specs({"harness": harness, "options": {option: 4}})
