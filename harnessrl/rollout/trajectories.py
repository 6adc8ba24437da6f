"""A trajectory view: what a person debugging an agent's training looks at first, as Markdown.

Per rollout (a few: the first, and the best / worst when rewards are known, else the one with the most chains
and the worst-ended one): its chains as a tree (the main agent's chain, then chains forked from it or started
apart: subagents, compaction, side calls), and each model call in order — the context the call added (not
trained, mask 0: the harness's messages, tool results) apart from the tokens the policy sampled (trained,
mask 1: its reply and tool calls), rollbacks and the sampled text they discarded, and the reward with its
parts. Built from `records.parquet` (the gateway journal's export: every call's exact prompt and sampled ids)
and the tokenizer. Bounded: long texts keep their head and tail (a note says how much was cut), and a rollout
shows at most `MAX_CALLS` calls.

The generate report embeds it (before verify: no reward yet); with verify's rewards, locally:

    python -m harnessrl.rollout.trajectories --rollouts runs/rollouts --rewards runs/verified [--rollout-id ID]
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

TEXT_CHARS = 700  # per text block: head and tail kept
MAX_CALLS = 12  # per rollout: the first and the last ones
PICK = 3  # rollouts shown
COLUMNS = ["rollout_id", "chain_id", "op", "parent_chain_id", "prompt_ids", "completion_ids"]
COLUMNS += ["discarded_trainable", "finish_reason", "started_at"]

Decode = Callable[[list[int]], str]


def clip(text: str, limit: int = TEXT_CHARS) -> str:
    """`text` with its middle cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
    return f"{head}\n[… {len(text) - len(head) - len(tail)} characters cut …]\n{tail}"


def fenced(text: str, info: str = "text") -> str:
    """A fenced code block whose fence no run of backticks in `text` can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def gateway_stats(calls: Iterable[dict]) -> dict[str, dict[str, int]]:
    """Per rollout id, what its model calls (records.parquet rows) add up to: calls, chains, splits (chains
    past the first), rollbacks, the longest prompt, sampled tokens and trainable tokens rollbacks discarded."""
    stats: dict[str, dict[str, Any]] = {}
    for c in calls:
        s = stats.setdefault(
            c["rollout_id"],
            {"calls": 0, "chains": set(), "rollbacks": 0, "prompt_tokens_max": 0, "completion_tokens": 0,
             "discarded_trainable": 0},
        )  # fmt: skip
        s["calls"] += 1
        s["chains"].add(c["chain_id"])
        s["rollbacks"] += c["op"] == "rollback"
        s["prompt_tokens_max"] = max(s["prompt_tokens_max"], len(c["prompt_ids"]))
        s["completion_tokens"] += len(c["completion_ids"])
        s["discarded_trainable"] += int(c["discarded_trainable"] or 0)
    out = {}
    for rid, s in stats.items():
        chains = len(s.pop("chains"))
        out[rid] = {**s, "chains": chains, "splits": max(0, chains - 1)}
    return out


def pick_rollouts(rows: list[dict], rewards: dict[str, dict] | None, n: int = PICK) -> list[tuple[str, str]]:
    """(rollout id, why it is shown): the first; with rewards the best and the worst; else the one with the
    most chains and the worst-ended one (not ok, else the most trainable tokens discarded)."""
    made = [r for r in rows if (r.get("gateway") or {}).get("calls")]
    if not made:
        return []
    chosen: list[tuple[str, str]] = [(made[0]["rollout_id"], "the first rollout")]

    def add(key: Callable[[dict], Any], why: str, among: list[dict]) -> None:
        """The rollout with the largest `key` of those not shown yet (ties: the first of them)."""
        left = [r for r in among if r["rollout_id"] not in {c[0] for c in chosen}]
        if left and len(chosen) < n:
            chosen.append((max(left, key=key)["rollout_id"], why))

    scored = [r for r in made if rewards and (rewards.get(r["rollout_id"]) or {}).get("reward") is not None]
    if scored:
        assert rewards is not None
        add(lambda r: rewards[r["rollout_id"]]["reward"], "the best reward", scored)
        add(lambda r: -rewards[r["rollout_id"]]["reward"], "the worst reward", scored)

    def badness(r: dict) -> tuple[bool, int, int]:
        g = r["gateway"]
        return (r.get("rollout_status") != "ok", g.get("discarded_trainable", 0), g.get("rollbacks", 0))

    add(badness, "the worst ending (status, discarded tokens)", made)
    add(lambda r: r["gateway"]["chains"], "the most chains", made)
    return chosen


def _reward_line(reward: dict | None) -> str:
    if reward is None:
        return (
            "reward: not verified yet (`harnessrl stage verify` grades the rollouts; "
            "`python -m harnessrl.rollout.trajectories --rewards <verified>` shows this view with them)"
        )
    if reward.get("reward") is None:
        why = reward.get("detail") or reward.get("rollout_status") or reward.get("status") or "no grade"
        return f"reward: none, the rollout was not scored: {clip(str(why), 300)}"
    parts = reward.get("reward_parts") or {}
    extra = {k: reward.get(k) for k in ("status", "verify_status", "resolved", "f2p_fraction") if k in reward}
    text = f"reward: **{reward.get('reward')}**"
    if parts:
        text += " — parts " + ", ".join(f"`{k}` {v:.3g}" for k, v in parts.items())
    if extra:
        text += " (" + ", ".join(f"{k} `{v}`" for k, v in extra.items()) + ")"
    return text


def _tree(calls: list[dict]) -> list[str]:
    """Chains as a nested list: the first call's chain is the main one; forks under their parent."""
    chains: dict[str, dict[str, Any]] = {}
    for c in calls:
        ch = chains.setdefault(
            c["chain_id"], {"op": c["op"], "parent": c["parent_chain_id"], "calls": 0, "sampled": 0}
        )
        ch["calls"] += 1
        ch["sampled"] += len(c["completion_ids"])
    main = calls[0]["chain_id"]

    def line(cid: str, depth: int) -> list[str]:
        ch = chains[cid]
        role = "main agent" if cid == main else ("forked" if ch["op"] == "fork" else "started apart")
        out = [
            f"{'  ' * depth}- `{cid}` — {role}: {ch['calls']} calls, {ch['sampled']} sampled (trained) tokens"
        ]
        for child, c in chains.items():
            if child != cid and c["parent"] == cid:
                out += line(child, depth + 1)
        return out

    lines: list[str] = []
    for cid, ch in chains.items():
        if cid == main or ch["parent"] not in chains:
            lines += line(cid, 0)
    return lines


def rollout_markdown(
    row: dict, calls: list[dict], decode: Decode, reward: dict | None, why: str
) -> list[str]:
    calls = sorted(calls, key=lambda c: c["started_at"])
    g = row.get("gateway") or {}
    episode = [f"status `{row.get('rollout_status')}`"]  # a workload without episodes has only a status
    if row.get("finish_reason"):
        episode.append(f"finish `{row['finish_reason']}`")
    if row.get("fate"):  # the RL loop's: what the step did with its group
        episode.append(f"group `{row['fate']}`")
    if row.get("turns") is not None:
        episode.append(f"{row['turns']} turns, {row.get('tool_calls', 0)} tool calls")
    spec = f"Spec `{row['spec_name']}` (harness `{row.get('harness')}`): " if row.get("spec_name") else ""
    lines = [
        f"### `{row['rollout_id']}` ({why})",
        "",
        f"{spec}{', '.join(episode)}; model calls {g.get('calls', len(calls))}, chains "
        f"{g.get('chains', '?')}, rollbacks {g.get('rollbacks', 0)}, trainable tokens discarded "
        f"{g.get('discarded_trainable', 0)}.",
        "",
        _reward_line(reward),
        "",
    ]
    if row.get("error"):
        lines += [f"error: {fenced(clip(str(row['error']), 300))}", ""]
    lines += ["Chains:", "", *_tree(calls), ""]
    half = MAX_CALLS // 2
    shown = (
        set(range(len(calls)))
        if len(calls) <= MAX_CALLS
        else {*range(half), *range(len(calls) - half, len(calls))}
    )
    current: dict[str, list[int]] = {}  # chain -> its tokens after the last call (prompt + sampled)
    for i, c in enumerate(calls):
        prompt, sampled = list(c["prompt_ids"]), list(c["completion_ids"])
        before = current.get(c["chain_id"])
        kept = _common(before, prompt) if before is not None else 0
        discarded = before[kept:] if before is not None and c["op"] == "rollback" else []
        new_context = prompt[kept:] if before is not None else prompt
        current[c["chain_id"]] = prompt + sampled
        if i not in shown:
            if i == half:
                lines += [f"[… {len(calls) - len(shown)} calls not shown …]", ""]
            continue
        lines.append(
            f"**call {i + 1}** · chain `{c['chain_id']}` · `{c['op']}` · {len(prompt)} prompt tokens, "
            f"{len(sampled)} sampled · finish `{c['finish_reason']}`"
        )
        lines.append("")
        if discarded:
            lines += [
                f"rolled back: {len(discarded)} tokens discarded "
                f"({c['discarded_trainable']} of them trained), they were:",
                fenced(clip(decode(discarded))),
            ]
        what = "context added (not trained)"
        if before is None:
            what = (
                "prompt (not trained)" if c["op"] == "new" else "prompt, from its parent chain (not trained)"
            )
        context = decode(new_context)
        if "<tool_response>" in context:
            what += ", with tool results"
        lines += [f"{what}, {len(new_context)} tokens:", fenced(clip(context), "text")]
        lines += [f"▶ sampled (trained), {len(sampled)} tokens:", fenced(clip(decode(sampled)), "text"), ""]
    return lines


def trajectory_markdown(
    rows: list[dict],
    calls: list[dict],
    decode: Decode,
    rewards: dict[str, dict] | None = None,
    only: list[str] | None = None,
) -> str:
    """The view's Markdown section (`## Trajectories`). `calls`: records.parquet rows of (at least) the shown
    rollouts; `rewards`: verify's rows by rollout id; `only`: these rollouts instead of the picked ones."""
    by_id = {r["rollout_id"]: r for r in rows}
    picked = [(rid, "chosen") for rid in only if rid in by_id] if only else pick_rollouts(rows, rewards)
    lines = [
        "## Trajectories",
        "",
        "Each model call: the context it added (mask 0, never trained) apart from what the policy sampled "
        "(▶, mask 1: trained). Long texts keep their head and tail; at most "
        f"{MAX_CALLS} calls per rollout.",
        "",
    ]
    if not picked:
        return "\n".join([*lines, "No rollout made a model call.", ""])
    for rid, why in picked:
        mine = [c for c in calls if c["rollout_id"] == rid]
        if not mine:
            continue
        lines += rollout_markdown(by_id[rid], mine, decode, (rewards or {}).get(rid), why)
    return "\n".join(lines) + "\n"


def read_calls(records_parquet: Path, rollout_ids: list[str]) -> list[dict]:
    """The records of these rollouts only (a run's records can be large)."""
    import pyarrow.parquet as pq

    if not rollout_ids:
        return []
    table = pq.read_table(records_parquet, columns=COLUMNS, filters=[("rollout_id", "in", rollout_ids)])
    return table.to_pylist()


def read_rewards(path: Path) -> dict[str, dict]:
    """verify's rows (rewards.jsonl, or its directory) by rollout id."""
    path = path / "rewards.jsonl" if path.is_dir() else path
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["rollout_id"]] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.rollout.trajectories", description=__doc__)
    parser.add_argument("--rollouts", type=Path, required=True, help="a generate stage's output directory")
    parser.add_argument("--rewards", type=Path, help="verify's output directory or rewards.jsonl")
    parser.add_argument("--rollout-id", action="append", help="show these rollouts (repeatable)")
    parser.add_argument("--model-dir", help="the policy's tokenizer directory (default: the tiny model)")
    parser.add_argument("--out", type=Path, help="write the Markdown here (default: stdout)")
    args = parser.parse_args(argv)
    from harnessrl.io import read_jsonl
    from harnessrl.light_tokenizer import load_gateway_tokenizer

    rows = list(read_jsonl(args.rollouts / "rollouts.jsonl"))
    rewards = read_rewards(args.rewards) if args.rewards else None
    wanted = args.rollout_id or [rid for rid, _ in pick_rollouts(rows, rewards)]
    calls = read_calls(args.rollouts / "records.parquet", wanted)
    tokenizer = load_gateway_tokenizer(args.model_dir)
    text = trajectory_markdown(
        rows, calls, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), rewards, args.rollout_id
    )
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
