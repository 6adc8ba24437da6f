"""The trajectory view (harnessrl/rollout/trajectories.py) from a real gateway journal's export: chains as a tree,
context apart from sampled tokens, a rollback and what it discarded, the reward and its parts, bounded text,
and the command that renders it locally with verify's rewards."""

from __future__ import annotations

import json

import openai

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from harnessrl.io import write_jsonl
from harnessrl.rollout.trajectories import (
    TEXT_CHARS,
    clip,
    fenced,
    main,
    pick_rollouts,
    read_calls,
    trajectory_markdown,
)
from tests.gateway.support import BASH_TOOL
from tests.support.fast_engine import FINAL_REPLY, TOOL_REPLY


def _row(rid: str, chains: int, rollbacks: int, discarded: int, status: str = "ok") -> dict:
    gateway = {"calls": 3, "chains": chains, "rollbacks": rollbacks, "discarded_trainable": discarded}
    return {
        "rollout_id": rid,
        "spec_name": "s",
        "harness": "react",
        "rollout_status": status,
        "finish_reason": "submitted",
        "turns": 3,
        "tool_calls": 1,
        "error": "",
        "gateway": gateway,
    }


def test_the_view_shows_chains_context_sampled_tokens_rollbacks_and_rewards(fast_engine, tokenizer, tmp_path):
    engine = fast_engine([{"text": TOOL_REPLY}, {"text": FINAL_REPLY}])
    g = GatewayServer(
        HTTPEngine(engine.base_url), tokenizer, tmp_path / "journal", "adm", config=GatewayConfig()
    )
    admin = GatewayAdmin(g.start(), "adm")
    s = admin.create_session("r0", "t")
    client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)
    start = [{"role": "user", "content": "Fix calc.py " + "x" * 3000}]
    client.chat.completions.create(model="m", messages=start, tools=[BASH_TOOL])  # type: ignore[arg-type]
    client.chat.completions.create(model="m", messages=start, tools=[BASH_TOOL])  # type: ignore[arg-type] # a retry: rollback
    side = [{"role": "system", "content": "You summarize."}, {"role": "user", "content": "Summarize."}]
    client.chat.completions.create(model="m", messages=side)  # type: ignore[arg-type] # a chain apart
    admin.export(str(tmp_path / "export"))
    g.stop()
    rows = [_row("r0", 2, 1, 20)]
    calls = read_calls(tmp_path / "export" / "records.parquet", ["r0"])
    rewards = {
        "r0": {"rollout_id": "r0", "reward": 1.0, "reward_parts": {"f2p_fraction": 1.0}, "status": "ok"}
    }
    text = trajectory_markdown(
        rows, calls, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), rewards
    )
    assert text.startswith("## Trajectories") and "### `r0` (the first rollout)" in text
    assert "reward: **1.0** — parts `f2p_fraction` 1" in text
    assert text.count("— main agent: 2 calls") == 1 and "— started apart: 1 calls" in text
    assert "rolled back: " in text and "I will list the files." in text.split("rolled back: ")[1]
    assert text.count("▶ sampled (trained)") == 3 and "prompt (not trained)" in text
    assert "characters cut …]" in text  # the long task text keeps its head and tail
    assert len(text) < 3 * 3 * TEXT_CHARS + 4000

    (tmp_path / "gen").mkdir()
    write_jsonl(tmp_path / "gen" / "rollouts.jsonl", rows)
    (tmp_path / "export" / "records.parquet").rename(tmp_path / "gen" / "records.parquet")
    (tmp_path / "verified").mkdir()
    write_jsonl(tmp_path / "verified" / "rewards.jsonl", list(rewards.values()))
    out = tmp_path / "view.md"
    assert (
        main(
            ["--rollouts", str(tmp_path / "gen"), "--rewards", str(tmp_path / "verified"), "--out", str(out)]
        )
        == 0
    )
    assert "reward: **1.0**" in out.read_text()


def test_which_rollouts_are_shown():
    rows = [_row("a", 1, 0, 0), _row("b", 3, 0, 0), _row("c", 1, 2, 40), _row("d", 1, 0, 0, "timeout")]
    assert pick_rollouts(rows, None) == [
        ("a", "the first rollout"),
        ("d", "the worst ending (status, discarded tokens)"),
        ("b", "the most chains"),
    ]
    rewards = {"a": {"reward": 0.0}, "b": {"reward": 1.0}, "c": {"reward": 0.5}}
    assert [rid for rid, _ in pick_rollouts(rows, rewards)] == ["a", "b", "c"]
    assert pick_rollouts([_row("z", 0, 0, 0) | {"gateway": {"calls": 0}}], None) == []


def test_texts_are_bounded_and_fenced_safely():
    assert clip("x" * 10) == "x" * 10
    cut = clip("a" * 5000, 300)
    assert len(cut) < 400 and "4700 characters cut" in cut
    block = fenced("code with ``` inside")
    assert block.startswith("````text\n") and block.endswith("\n````")
    assert json.dumps(block)
