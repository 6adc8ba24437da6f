"""The real Claude Code CLI (pinned, `make cli-agents`) as a training harness: inside the real bubblewrap sandbox,
through the real gateway, driven by a scripted engine (tests/support/claude_code.py: not a model) through a real
task of the minirepo task set; verified by the real verify code. Each test names the gateway defect it guards
(issue 23): every one of them failed against the gateway before its fix."""

from __future__ import annotations

import json

import pytest

from components.sft.demos import Demonstration
from harnessrl.gateway.samples import build_samples
from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.claude_code import ClaudeCodeConfig
from harnessrl.schema import RolloutStatus
from tests.gateway.support import read_records
from tests.support.claude_code import COMPACT_MARK, call, requires_claude_code
from tests.support.cli_agents import assert_refused, cli_rollouts, generate_two_tasks, one_line_change
from tests.support.fixtures import requires_bwrap

pytestmark = [requires_bwrap, requires_claude_code, pytest.mark.slow]

SONNET = {"main": "claude-sonnet-4-6", "fast": "claude-haiku-4-5", "subagent": "claude-haiku-4-5"}


def fix_script(path: str, old: str, new: str) -> tuple[str, ...]:
    """View the file, replace line `old` by `new` (Edit without `replace_all`: the CLI echoes it back with the
    default added; the lines stripped: Edit finds them), run the tests, finish."""
    file = f"/workspace/{path}"
    old, new = old.strip(), new.strip()
    return (
        call("Read", "Let me look at the code.", file_path=file),
        call("Edit", "I will fix the bug.", file_path=file, old_string=old, new_string=new),
        call("Bash", command="python -m pytest -q 2>&1 | tail -3", description="Run the tests"),
        "The bug is fixed and the tests pass.",
    )


def test_generate_stage_runs_claude_code_end_to_end(synth_taskset, tokenizer, tmp_path, capsys):
    """`harnessrl stage generate --specs '[{"harness": "claude-code", ...}]'`: the scripted fix of one task is
    resolved (reward 1), the scripted wrong edit of the other is not (reward 0). Both specs' model names: the
    CLI's default (which puts a system message inside `messages`) and sonnet/haiku. Guards: system messages in
    `messages`; the Edit echoed back with `"replace_all": false` (no rollback, no discarded tokens)."""
    options = {"tools": ["Bash", "Read", "Edit"], "models": SONNET}
    out, rows, records, good = generate_two_tasks(
        "claude-code", fix_script, options, synth_taskset, tokenizer, tmp_path, capsys
    )
    for r in rows.values():
        first = min((c for c in records if c["rollout_id"] == r["rollout_id"]), key=lambda c: c["started_at"])
        prompt = tokenizer.decode(first["prompt_ids"])
        # the CLI's default model sends its agent list as a system message inside `messages`
        mid_system = prompt.count("<|im_start|>system") == 2
        assert mid_system == (r["spec_name"] == "default"), prompt[:300]
    transcript = json.loads((out / "transcripts" / f"{good}__r0.json").read_text())
    results = [b for e in transcript if e.get("type") == "user" for b in e["message"]["content"]]
    assert "passed" in str(results[-1].get("content"))  # the CLI ran the tests, inside the sandbox


@pytest.fixture
def rollout(task, tokenizer, tmp_path):
    with cli_rollouts(ClaudeCodeConfig, task, tokenizer, tmp_path) as make:
        yield make


README = "/workspace/README.md"
# a 1x1 PNG
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def test_the_clis_tools_see_neither_host_files_nor_the_network(rollout, task, tokenizer):
    """The CLI's own tool executions happen inside the sandbox: no host file, no network (not even the
    gateway's TCP port), uid 1000. Guards: parallel tool results sent back in another order than their calls
    are matched by id (rendered in the calls' order); reading an image (a PNG in a tool result) reaches the
    gateway as a text placeholder instead of a 400."""
    r, engine = rollout(())
    probe = r.escape_probe()
    make_png = (
        f"python3 -c \"import base64; open('/tmp/dot.png', 'wb').write(base64.b64decode('{PNG_B64}'))\""
    )
    engine.demos[0] = Demonstration(
        task.iid,
        task.row["problem_statement"],
        (
            call("Bash", command=probe, description="Probe the sandbox"),
            # two calls at once: the slower Glob's result comes back after the Read's
            call("Glob", pattern="**/*.py", path="/usr/lib/python3.11")
            + "\n"
            + call("Read", file_path=README),
            call("Bash", command=make_png, description="Draw a dot"),
            call("Read", file_path="/tmp/dot.png"),
            "Done probing.",
        ),
    )
    res = r.run(task, {"tools": ["Bash", "Read", "Glob"], "models": SONNET})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    results = [
        str(b.get("content"))
        for e in res.transcript
        if e.get("type") == "user"
        for b in e["message"]["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert_refused(results[0])
    recs = r.records()
    assert [x.op for x in recs] == ["new", "extend", "extend", "extend", "extend"]
    # the CLI sent the parallel results in the order they finished; they are rendered in the calls' order
    responses = tokenizer.decode(recs[2].delta_ids).split("<tool_response>")[1:]
    assert [("/usr/lib/python3.11/" in x, "minicalc" in x) for x in responses] == [
        (True, False),
        (False, True),
    ]
    last_prompt = tokenizer.decode(recs[-1].delta_ids)
    assert "[image (image/png) omitted: this model reads text only]" in last_prompt


def test_a_full_context_ends_the_episode_as_a_context_budget(rollout, task):
    """The gateway's budget below the CLI's first prompt: Anthropic's `prompt is too long` 400, which the CLI
    reads as a full context; the rollout ends `ok` / `token_budget` (the agent's end, scored), never an infra
    error (before: empty `max_tokens` replies the CLI asked to "resume" until it failed)."""
    r, _ = rollout((call("Read", file_path="/workspace/README.md"), "Done."), max_model_len=2048)
    res = r.run(task, {"models": SONNET})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET), res.error
    assert "Prompt is too long" in res.error and res.turns == 0
    assert r.admin.metrics()["context_exhausted"] >= 1


def test_a_reply_cut_by_the_reply_budget_ends_the_episode_as_the_agents_token_budget(rollout, task):
    """`limits.reply_tokens`: the CLI asks for that many output tokens (CLAUDE_CODE_MAX_OUTPUT_TOKENS), the
    gateway cuts every reply there (`stop_reason: max_tokens`), the CLI tries to continue and then gives up;
    the rollout ends `ok` / `token_budget` (the agent's end, scored), never an infra error."""
    long = "I will first read every file of the repository and think about each of them. " * 8
    r, _ = rollout((long,) * 8, reply_tokens=12)
    res = r.run(task, {"models": SONNET, "reply_tokens": 12})
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET), res.error
    assert "12 output token maximum" in res.error
    calls = r.records()
    assert calls and all(len(c.completion_ids) == 12 for c in calls)


def test_a_window_that_holds_one_reply_ends_a_cut_reply_without_the_clis_continuations(rollout, task):
    """`limits.context_tokens` of the first prompt plus one reply and a little: the CLI's own request to continue
    a cut reply (the cut reply and its "resume" note appended) no longer fits, the gateway answers it with
    Anthropic's `prompt is too long`, and the CLI ends after one call (`token_budget`, scored) instead of asking
    three more times — the same end, a quarter of the calls."""
    long = "I will first read every file of the repository and think about each of them. " * 8
    options = {"models": SONNET, "bare": True, "tools": [], "reply_tokens": 12}
    r, _ = rollout((long,) * 8, reply_tokens=12)
    res = r.run(task, options)
    first = r.records()
    assert res.finish_reason == EpisodeEnd.TOKEN_BUDGET and len(first) == 4, res.error  # its continuations
    window = first[0].timings.prompt_tokens + 12 + 8
    assert first[1].timings.prompt_tokens > window  # the first continuation would not fit

    r, _ = rollout((long,) * 8, reply_tokens=12, context_tokens=window)
    res = r.run(task, options)
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET), res.error
    assert "Prompt is too long" in res.error
    [call] = r.records()
    assert len(call.completion_ids) == 12 and r.admin.metrics()["context_exhausted"] >= 1  # no engine call


def test_compaction_is_a_chain_of_its_own(rollout, task, tokenizer):
    """Auto-compaction (forced early with CLAUDE_AUTOCOMPACT_PCT_OVERRIDE) sends the history before the last
    executed turn plus "summarize": a chain of its own in the same rollout (a second sample), never a rollback
    that discards the executed Edit's sampled tokens."""
    fix = one_line_change(task.row["patch"])
    assert fix is not None
    r, engine = rollout(fix_script(fix[0], fix[2], fix[1]))  # the bug is the patch's "+" line
    options = {  # --bare: a ~1.3k-token first prompt; compaction at 2% of a 100k window
        "tools": ["Bash", "Read", "Edit"],
        "models": SONNET,
        "bare": True,
        "auto_compact_window": 100_000,
        "env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "2"},
    }
    res = r.run(task, options)
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    recs = r.records()
    compactions = [x for x in recs if COMPACT_MARK in tokenizer.decode(x.delta_ids)]
    assert len(compactions) == engine.compactions >= 1 and res.compactions >= 1
    assert {x.op for x in compactions} == {"fork"}  # from the main chain's prefix, a chain of its own
    assert "rollback" not in [x.op for x in recs] and sum(x.discarded_trainable for x in recs) == 0
    agent = [x for x in recs if x not in compactions]
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = [tokenizer.encode(t, add_special_tokens=False) + [eot] for t in engine.demos[0].replies]
    assert [x.completion_ids for x in agent] == script  # the whole fix, in order, across the compaction
    samples = build_samples(read_records(r.gateway.journal_dir))
    assert len(samples) == len({x.chain_id for x in recs}) >= 2  # many samples, one rollout
    edit = agent[1]
    assert sum(_holds(s, edit) for s in samples) == 1  # the executed Edit trains, once
    assert fix[1].strip() in (r.workspace / fix[0]).read_text()


def _holds(sample, record) -> bool:
    """The sample trains the record's sampled tokens."""
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    n = len(record.completion_ids)
    return any(trained[i : i + n] == record.completion_ids for i in range(len(trained) - n + 1))


def test_an_endpoint_the_gateway_does_not_serve_is_an_infra_error(rollout, task):
    """The CLI pointed at a route the gateway lacks gets Anthropic's not_found_error (JSON, never an HTML 404;
    the CLI reads it as a model it may not use); the rollout is an infra_error that says so."""
    r, _ = rollout(("Done.",))
    base = r.session.openai_base_url.removesuffix("/v1") + "/not-served/v1"
    res = r.run(task, {"tools": ["Bash"], "models": SONNET}, base_url=base)
    assert (res.status, res.finish_reason) == (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR), res.error
    assert "the gateway does not serve what the CLI asked for (HTTP 404)" in res.error


def test_first_prompt_sizes(rollout, task, tokenizer):
    """The CLI's first prompt in the policy's tokens (reported in docs/harness.md): default tool set and model,
    three tools, --bare."""
    r, _ = rollout(("Done.",))
    sizes = {}
    for name, options in {
        "default": {},
        "tools": {"tools": ["Bash", "Read", "Edit"], "models": SONNET},
        "bare": {"tools": ["Bash", "Read", "Edit"], "models": SONNET, "bare": True},
    }.items():
        r.session = r.admin.create_session(f"r-{name}", task.iid)
        res = r.run(task, options)
        assert res.status is RolloutStatus.OK, res.error
        sizes[name] = r.records()[-1].timings.prompt_tokens
    print("first prompt tokens:", sizes)
    assert sizes["bare"] < sizes["tools"] < sizes["default"]
    assert sizes["bare"] < 4096
