"""The real Codex CLI (pinned, `make cli-agents`) as a training harness: inside the real bubblewrap sandbox, through
the real gateway's Responses API, driven by a scripted engine (tests/support/claude_code.py's CliScriptEngine: not
a model) through a real task of the minirepo task set; verified by the real verify code."""

from __future__ import annotations

import json

import pytest

from components.sft.demos import Demonstration
from harnessrl.gateway.samples import build_samples
from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.codex import CodexConfig
from harnessrl.schema import RolloutStatus
from tests.gateway.support import read_records
from tests.support.claude_code import CODEX_COMPACT_MARK, call
from tests.support.cli_agents import assert_refused, cli_rollouts, generate_two_tasks, one_line_change
from tests.support.codex import fix_script, requires_codex
from tests.support.fixtures import requires_bwrap

pytestmark = [requires_bwrap, requires_codex, pytest.mark.slow]

MAX = "gpt-5.1-codex-max"  # a model name whose prompt offers plain function tools (exec_command, ...)


def test_generate_stage_runs_codex_end_to_end(synth_taskset, tokenizer, tmp_path, capsys):
    """`harnessrl stage generate --specs '[{"harness": "codex", ...}]'`: the scripted fix of one task is resolved
    (reward 1), the scripted wrong edit of the other is not (reward 0); under the CLI's default model (its code
    mode: tools declared inside `input`) and under a name that gets plain function tools. Every call extends one
    chain: the samples hold exactly the sampled tokens, masks only on them."""
    out, _, records, good = generate_two_tasks(
        "codex", fix_script, {"model": MAX}, synth_taskset, tokenizer, tmp_path, capsys
    )
    assert {c["api"] for c in records} == {"responses"}
    assert "## Trajectories" in (out / "report.md").read_text()
    transcript = json.loads((out / "transcripts" / f"{good}__r0.json").read_text())
    commands = [e["item"] for e in transcript if e.get("type") == "item.completed"]
    assert [c["type"] for c in commands if c["type"] != "agent_message"] == [
        "command_execution",
        "file_change",
        "command_execution",
    ]
    assert "passed" in commands[-2]["aggregated_output"]  # the CLI ran the tests, inside the sandbox


@pytest.fixture
def rollout(task, tokenizer, tmp_path):
    with cli_rollouts(CodexConfig, task, tokenizer, tmp_path) as make:
        yield make


def test_the_clis_tools_see_neither_host_files_nor_the_network(rollout, task):
    """Codex's own command executions happen inside the sandbox: no host file, no network (not even the gateway's
    TCP port; only the bridge's loopback port leads out, to this session), uid 1000, its home on the run's /tmp."""
    r, engine = rollout(())
    probe = r.escape_probe(also="echo home=$HOME codex=$CODEX_HOME; ")
    engine.demos[0] = Demonstration(
        task.iid, task.row["problem_statement"], (call("exec_command", cmd=probe), "Done probing.")
    )
    res = r.run(task, {"model": MAX})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    items = [e["item"] for e in res.transcript if e.get("type") == "item.completed"]
    [out] = [x["aggregated_output"] for x in items if x["type"] == "command_execution"]
    assert_refused(out)
    assert "home=/tmp codex=/tmp/.codex" in out
    assert [x.op for x in r.records()] == ["new", "extend"]


def test_a_full_context_ends_the_episode_as_a_context_budget(rollout, task):
    """The gateway's budget below the CLI's first prompt: `context_length_exceeded` in a failed stream, which
    Codex reads as a full context window; the rollout ends ok / token_budget (the agent's end, scored)."""
    r, _ = rollout((call("exec_command", cmd="ls"), "Done."), max_model_len=2048)
    res = r.run(task, {"model": MAX})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET), res.error
    assert "context window" in res.error
    assert r.admin.metrics()["context_exhausted"] >= 1


def test_a_reply_cut_at_the_token_limit_ends_the_episode_as_a_token_budget(rollout, task):
    r, _ = rollout(("word " * 3000,))
    res = r.run(task, {"model": MAX})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET), res.error
    assert "max_output_tokens" in res.error


def test_the_model_call_budget_ends_the_run(rollout, task):
    fix = one_line_change(task.row["patch"])
    assert fix is not None
    r, _ = rollout(fix_script(fix[0], fix[2], fix[1]))
    res = r.run(task, {"model": MAX, "max_turns": 2})
    assert (res.status, res.finish_reason, res.turns) == (RolloutStatus.OK, EpisodeEnd.TURN_BUDGET, 2), (
        res.error
    )
    assert len(r.records()) == 2  # the third call never reached the gateway


def test_compaction_is_a_chain_of_its_own(rollout, task, tokenizer):
    """Auto-compaction (forced early with model_auto_compact_token_limit) sends the history with no tools and a
    "summarize" turn, then goes on from the summary: chains of their own in the same rollout (three samples),
    never a rollback of an executed turn; the whole fix is sampled in order across it."""
    fix = one_line_change(task.row["patch"])
    assert fix is not None
    r, engine = rollout(fix_script(fix[0], fix[2], fix[1]))
    res = r.run(task, {"model": MAX, "config": {"model_auto_compact_token_limit": 5600}})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    recs = r.records()
    compactions = [x for x in recs if CODEX_COMPACT_MARK in tokenizer.decode(x.inherited_ids + x.delta_ids)]
    assert len(compactions) == engine.compactions >= 1
    assert "rollback" not in [x.op for x in recs] and sum(x.discarded_trainable for x in recs) == 0
    agent = [x for x in recs if x not in compactions]
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = [tokenizer.encode(t, add_special_tokens=False) + [eot] for t in engine.demos[0].replies]
    assert [x.completion_ids for x in agent] == script
    samples = build_samples(read_records(r.gateway.journal_dir))
    assert len(samples) == len({x.chain_id for x in recs}) >= 3  # main, compaction, continuation
    assert fix[1] in (r.workspace / fix[0]).read_text()


def test_code_mode_runs_the_policys_javascript_over_its_nested_tools(rollout, task, tokenizer):
    """Under its default model Codex offers one freeform `exec` tool (JavaScript in a V8 isolate, its tools on
    `tools.*`): the policy's call reaches the CLI as a `custom_tool_call` with the raw script, the script runs a
    command inside the sandbox through `tools.exec_command`, and its `text()` comes back in the next prompt as
    the call's output — one chain, every sampled token kept."""
    js = (
        "const r = await tools.exec_command({cmd: 'echo ran-in-v8 > v8.txt && cat v8.txt && id -u'});\n"
        "text('exec said: ' + r.output.trim().split('\\n').join(' / '));"
    )
    r, engine = rollout((call("exec", "Let me run a command.", input=js), "Done."))
    res = r.run(task, {})  # the CLI's default model: code mode
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    assert (r.workspace / "v8.txt").read_text() == "ran-in-v8\n"  # the script's command ran in the workspace
    recs = r.records()
    assert [x.op for x in recs] == ["new", "extend"]
    assert sum(x.discarded_trainable for x in recs) == 0
    assert [x.completion_ids for x in recs] == engine.sampled
    result = tokenizer.decode(recs[1].delta_ids)
    assert "exec said: ran-in-v8 / 1000" in result, result[-2000:]  # its output, and the sandbox's uid


def test_an_endpoint_the_gateway_does_not_serve_is_an_infra_error(rollout, task):
    """Codex pointed at a route the gateway lacks gets OpenAI-shaped JSON 404s (it retries, then gives up); the
    rollout is an infra_error that says so."""
    r, _ = rollout(("Done.",))
    base = r.session.openai_base_url.removesuffix("/v1") + "/not-served/v1"
    res = r.run(task, {"model": MAX, "max_retries": 0}, base_url=base)
    assert (res.status, res.finish_reason) == (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR), res.error
    assert "the gateway does not serve what the CLI asked for (HTTP 404)" in res.error


def test_first_prompt_sizes(rollout, task, tokenizer):
    """The CLI's first prompt in the policy's tokens (reported in docs/harness.md): its default model (code mode),
    a model name with plain function tools, and that with the base instructions replaced (`base_instructions`:
    Codex's own system prompt gone, ours in its place)."""
    r, _ = rollout(("Done.",))
    own = 'You are a helpful AI assistant named SmolLM.\nAnswer in one "sentence".'
    sizes, prompts = {}, {}
    variants = {"default": {}, "max": {"model": MAX}, "own": {"model": MAX, "base_instructions": own}}
    for name, options in variants.items():
        r.session = r.admin.create_session(f"r-{name}", task.iid)
        res = r.run(task, options)
        assert res.status is RolloutStatus.OK, res.error
        first = r.records()[-1]
        sizes[name] = first.timings.prompt_tokens
        prompts[name] = tokenizer.decode(first.inherited_ids + first.delta_ids)
    print("first prompt tokens:", sizes)
    assert sizes["own"] < sizes["max"] < 8192 < sizes["default"]
    assert own in prompts["own"] and own not in prompts["max"]
    codex = "You are a coding agent running in the Codex CLI"
    assert codex in prompts["max"] and codex not in prompts["own"]
