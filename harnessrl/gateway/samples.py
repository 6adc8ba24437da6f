"""Sample assembly: journal records -> per-call rows and training `Sample`s.

One sample per chain: the chain's final token history — prompt, then alternating mask-0 context and mask-1
sampled tokens (verbatim sampled ids, their logprobs and policy versions); rolled-back turns are gone.
Selection `all` keeps every chain, `longest` only the longest chain (most tokens) of each rollout. A session
created with `train_chains: main` (a harness spec's choice) gives only its main chain — the one its first call
started: the agent from the task prompt; subagents, compaction and side calls are left out — before the
selection. Every sample carries its rollout id and group id; a rollout whose session failed gets
`rollout_status="failed"`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harnessrl.schema import RolloutStatus, Sample

from .chains import STARTS_CHAIN, Chain, apply_call
from .enums import Selection, SessionStatus, TrainChains
from .records import CallRecord, Record, SessionEndRecord, SessionRecord, status_after


def _sessions(
    records: Iterable[Record], main_only: set[str] | None = None
) -> tuple[dict[str, SessionStatus], list[CallRecord]]:
    """Session statuses and the call records; `main_only` collects the sessions that train their main chain
    only."""
    status: dict[str, SessionStatus] = {}
    calls: list[CallRecord] = []
    for rec in records:
        if isinstance(rec, SessionRecord):
            status[rec.session_id] = SessionStatus.ACTIVE
            if main_only is not None and rec.train_chains is TrainChains.MAIN:
                main_only.add(rec.session_id)
        elif isinstance(rec, SessionEndRecord):
            status[rec.session_id] = status_after(status.get(rec.session_id, SessionStatus.ACTIVE), rec)
        elif isinstance(rec, CallRecord):
            calls.append(rec)
    return status, calls


def _keep(rec: CallRecord, session_id: str | None, rollout_id: str | None) -> bool:
    return (session_id is None or rec.session_id == session_id) and (
        rollout_id is None or rec.rollout_id == rollout_id
    )


def call_rows(
    records: Iterable[Record], session_id: str | None = None, rollout_id: str | None = None
) -> list[dict[str, Any]]:
    """One row per model call with its full prompt ids reconstructed from the chain deltas."""
    _, calls = _sessions(records)
    chains: dict[str, Chain] = {}
    rows = []
    for rec in calls:
        if rec.op in STARTS_CHAIN:
            prompt = list(rec.inherited_ids) + rec.delta_ids
        else:
            prompt = chains[rec.chain_id].tokens[: rec.base_len] + rec.delta_ids
        apply_call(chains, rec)
        if not _keep(rec, session_id, rollout_id):
            continue
        rows.append(
            {
                "call_id": rec.call_id,
                "session_id": rec.session_id,
                "rollout_id": rec.rollout_id,
                "group_id": rec.group_id,
                "chain_id": rec.chain_id,
                "op": rec.op.value,
                "parent_chain_id": rec.parent_chain_id,
                "prompt_ids": prompt,
                "completion_ids": rec.completion_ids,
                "completion_logprobs": rec.completion_logprobs,
                "policy_versions": rec.completion_versions,
                "loss_mask": [1] * len(rec.completion_ids),
                "finish_reason": rec.finish_reason.value,
                "discarded_trainable": rec.discarded_trainable,
                "drift": None if rec.drift is None else rec.drift.value,
                "api": None if rec.api is None else rec.api.value,
                "started_at": rec.timings.started_at,
                "engine_s": rec.timings.engine_s,
                "gateway_cpu_s": rec.timings.gateway_cpu_s,
            }
        )
    return rows


def build_samples(
    records: Iterable[Record],
    selection: Selection | str = Selection.ALL,
    session_id: str | None = None,
    rollout_id: str | None = None,
    rewards: dict[str, float] | None = None,
) -> list[Sample]:
    try:
        selection = Selection(selection)
    except ValueError:
        raise ValueError(f"selection {selection!r}: choose one of {[s.value for s in Selection]}") from None
    main_only: set[str] = set()
    status, calls = _sessions(records, main_only)
    chains: dict[str, Chain] = {}
    owner: dict[str, CallRecord] = {}
    main_chain: dict[str, str] = {}  # session -> the chain its first call started
    for rec in calls:
        apply_call(chains, rec)
        owner[rec.chain_id] = rec
        main_chain.setdefault(rec.session_id, rec.chain_id)
    by_rollout: dict[str, list[tuple[Chain, CallRecord]]] = {}
    for cid, chain in chains.items():
        rec = owner[cid]
        if rec.session_id in main_only and main_chain[rec.session_id] != cid:
            continue  # a side chain of a session that trains its main chain only
        if _keep(rec, session_id, rollout_id):
            by_rollout.setdefault(rec.rollout_id, []).append((chain, rec))
    samples = []
    for rid, items in by_rollout.items():
        if selection is Selection.LONGEST:
            items = [max(items, key=lambda it: len(it[0].tokens))]
        for chain, rec in items:
            failed = status.get(rec.session_id) is SessionStatus.FAILED
            samples.append(
                Sample(
                    sample_id=f"{rid}/{chain.chain_id}",
                    rollout_id=rid,
                    group_id=rec.group_id,
                    input_ids=list(chain.tokens),
                    loss_mask=list(chain.mask),
                    behavior_logprobs=list(chain.logprobs),
                    policy_version=list(chain.versions),
                    reward=(rewards or {}).get(rid),
                    rollout_status=RolloutStatus.FAILED if failed else RolloutStatus.OK,
                )
            )
    return samples
