"""Sample assembly and export: journal records -> per-call rows and training `Sample`s (Parquet).

One sample per chain: the chain's final token history — prompt, then alternating mask-0 context and mask-1
sampled tokens (verbatim sampled ids, their logprobs and policy versions); rolled-back turns are gone.
Selection `all` keeps every chain, `longest` only the longest chain (most tokens) of each rollout. Every
sample carries its rollout id and group id; a rollout whose session failed gets `rollout_status="failed"`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.io import atomic_output
from harnessrl.schema import Sample

from .chains import Chain, apply_call

SELECTIONS = ("all", "longest")


def _sessions(records: Iterable[dict[str, Any]]) -> tuple[dict[str, dict], list[dict]]:
    sessions: dict[str, dict] = {}
    calls: list[dict] = []
    for rec in records:
        t = rec.get("type")
        if t == "session":
            sessions[rec["session_id"]] = {**rec, "status": "active", "reason": None}
        elif t == "session_end":
            s = sessions.setdefault(rec["session_id"], {"session_id": rec["session_id"]})
            if s.get("status") != "failed":  # a failure stays a failure even if ended afterwards
                s["status"], s["reason"] = rec["status"], rec.get("reason")
        elif t == "call":
            calls.append(rec)
    return sessions, calls


def _keep(rec: dict, session_id: str | None, rollout_id: str | None) -> bool:
    return (session_id is None or rec.get("session_id") == session_id) and (
        rollout_id is None or rec.get("rollout_id") == rollout_id
    )


def call_rows(
    records: Iterable[dict[str, Any]], session_id: str | None = None, rollout_id: str | None = None
) -> list[dict[str, Any]]:
    """One row per model call with its full prompt ids reconstructed from the chain deltas."""
    _, calls = _sessions(records)
    chains: dict[str, Chain] = {}
    rows = []
    for rec in calls:
        if rec["op"] in ("new", "fork"):
            prompt = list(rec["inherited_ids"]) + rec["delta_ids"]
        else:
            prompt = chains[rec["chain_id"]].tokens[: rec["base_len"]] + rec["delta_ids"]
        apply_call(chains, rec)
        if not _keep(rec, session_id, rollout_id):
            continue
        rows.append(
            {
                "call_id": rec["call_id"],
                "session_id": rec["session_id"],
                "rollout_id": rec["rollout_id"],
                "group_id": rec["group_id"],
                "chain_id": rec["chain_id"],
                "op": rec["op"],
                "parent_chain_id": rec.get("parent_chain_id"),
                "prompt_ids": prompt,
                "completion_ids": rec["completion_ids"],
                "completion_logprobs": rec["completion_logprobs"],
                "policy_versions": rec["completion_versions"],
                "loss_mask": [1] * len(rec["completion_ids"]),
                "finish_reason": rec["finish_reason"],
                "discarded_trainable": rec["discarded_trainable"],
                "drift": rec.get("drift"),
                "api": rec.get("api"),
                "started_at": rec["timings"].get("started_at"),
                "engine_s": rec["timings"].get("engine_s"),
                "gateway_cpu_s": rec["timings"].get("gateway_cpu_s"),
            }
        )
    return rows


def build_samples(
    records: Iterable[dict[str, Any]],
    selection: str = "all",
    session_id: str | None = None,
    rollout_id: str | None = None,
    rewards: dict[str, float] | None = None,
) -> list[Sample]:
    if selection not in SELECTIONS:
        raise ValueError(f"selection {selection!r}: choose one of {SELECTIONS}")
    records = list(records)
    sessions, calls = _sessions(records)
    chains: dict[str, Chain] = {}
    owner: dict[str, dict] = {}
    for rec in calls:
        apply_call(chains, rec)
        owner[rec["chain_id"]] = rec
    by_rollout: dict[str, list[tuple[Chain, dict]]] = {}
    for cid, chain in chains.items():
        rec = owner[cid]
        if _keep(rec, session_id, rollout_id):
            by_rollout.setdefault(rec["rollout_id"], []).append((chain, rec))
    samples = []
    for rid, items in by_rollout.items():
        if selection == "longest":
            items = [max(items, key=lambda it: len(it[0].tokens))]
        for chain, rec in items:
            status = sessions.get(rec["session_id"], {}).get("status", "active")
            samples.append(
                Sample(
                    sample_id=f"{rid}/{chain.chain_id}",
                    rollout_id=rid,
                    group_id=rec["group_id"],
                    input_ids=list(chain.tokens),
                    loss_mask=list(chain.mask),
                    behavior_logprobs=list(chain.logprobs),
                    policy_version=list(chain.versions),
                    reward=(rewards or {}).get(rid),
                    rollout_status="failed" if status == "failed" else "ok",
                )
            )
    return samples


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    path = Path(path)
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp)
    return path


def export(
    records: Iterable[dict[str, Any]],
    out_dir: str | os.PathLike,
    selection: str = "all",
    session_id: str | None = None,
    rollout_id: str | None = None,
) -> dict[str, Any]:
    """Writes `records.parquet` (one row per call) and `samples.parquet` (Sample rows) under out_dir."""
    records = list(records)
    out = Path(out_dir)
    calls = call_rows(records, session_id, rollout_id)
    samples = [s.to_row() for s in build_samples(records, selection, session_id, rollout_id)]
    write_parquet(calls, out / "records.parquet")
    write_parquet(samples, out / "samples.parquet")
    return {"records": len(calls), "samples": len(samples), "out_dir": str(out)}
