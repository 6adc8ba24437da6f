"""The journal's records as types. Written and read only by `journal.py` (one codec, on-disk JSON lines).

A session's life is `SessionRecord`, then `CallRecord`s (state changes of its chains, applied by
`chains.apply_call`), `NoticeRecord`s (calls answered without the engine), and at most one effective
`SessionEndRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harnessrl.engine.base import FinishReason

from .enums import Api, ChainOp, Drift, NodeKind, NoticeKind, RecordType, SessionStatus, TrainChains


@dataclass(frozen=True)
class Node:
    """A message boundary in a chain: the chained hash of the messages so far and the token length there."""

    cum: bytes
    token_len: int
    kind: NodeKind


@dataclass
class SessionRecord:
    session_id: str
    rollout_id: str
    group_id: str
    key_sha256: str  # the session's API key is never stored
    created_at: float = 0.0
    train_chains: TrainChains = TrainChains.ALL  # which of its chains become samples
    reply_tokens: int | None = None  # each call's output tokens at most (None: what the call asks)
    context_tokens: int | None = None  # prompt + reply of each call at most (None: the engine's context)
    TYPE = RecordType.SESSION


@dataclass
class SessionEndRecord:
    session_id: str
    status: SessionStatus  # ended | failed
    reason: str | None = None
    at: float = 0.0
    TYPE = RecordType.SESSION_END


@dataclass
class NoticeRecord:
    session_id: str
    kind: NoticeKind
    prompt_tokens: int
    at: float = 0.0
    TYPE = RecordType.NOTICE


@dataclass
class CallTimings:
    started_at: float = 0.0
    engine_s: float = 0.0
    prompt_tokens: int = 0
    drift_cpu_s: float = 0.0  # the sampled full re-render of the drift check
    gateway_cpu_s: float = 0.0  # prompt building + record, without the drift check
    parse_cpu_s: float = 0.0  # JSON body + message conversion (O(request size))


@dataclass
class CallRecord:
    """One model call: the chain delta it applies (O(new tokens)), what was sampled, and how."""

    call_id: str
    session_id: str
    rollout_id: str
    group_id: str
    chain_id: str
    op: ChainOp
    parent_chain_id: str | None  # fork: the chain the inherited tokens come from
    base_len: int  # extend/rollback: the chain is cut back to this many tokens first
    base_nodes: int
    inherited_ids: list[int]  # new/fork: the token prefix the new chain starts with (mask 0)
    inherited_nodes: list[Node]
    delta_ids: list[int]  # rendering of the new messages + generation prompt (mask 0)
    new_nodes: list[Node]
    completion_ids: list[int]  # sampled, verbatim (mask 1)
    completion_logprobs: list[float]
    completion_versions: list[int]
    close_ids: list[int]  # template tokens closing the turn that were not sampled (mask 0)
    assistant_cum: bytes  # chained hash of the messages including this reply
    finish_reason: FinishReason
    discarded_trainable: int  # rollback: sampled tokens cut from the chain
    drift: Drift | None = None
    api: Api | None = None
    timings: CallTimings = field(default_factory=CallTimings)
    TYPE = RecordType.CALL


Record = SessionRecord | SessionEndRecord | NoticeRecord | CallRecord


def status_after(current: SessionStatus, end: SessionEndRecord) -> SessionStatus:
    """A failure stays a failure, even if the session is ended again afterwards."""
    return current if current is SessionStatus.FAILED else end.status
