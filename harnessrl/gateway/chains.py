"""Chains: token histories of one session, matched to requests by chained message hashes.

A request either extends a chain (its messages start with the chain's whole message list), rolls back the
chain's last assistant turn (retry, or a rewritten last turn: the replacement enters as mask-0 context), or
starts a new chain (split: compaction, other tools, a concurrent sub-agent, a deeper rewind; also a request
that leaves out a last turn whose tool calls ran and goes on from before it, as Claude Code's compaction does).
A new chain may reuse the token prefix of the chain it split from; inherited tokens are mask 0 there (the chain
they came from trains them). A chain with a call in flight is reserved, so concurrent calls never share a chain buffer.

State changes are *call records* (`records.CallRecord`, journaled) applied by `apply_call`; the live gateway and
journal recovery / sample assembly run the same function, so a replay rebuilds exactly the acknowledged state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from .enums import ChainOp, NodeKind
from .messages import MessageHasher, Msg
from .records import CallRecord, Node
from .render import ChatRenderer


@dataclass
class Chain:
    chain_id: str
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    last_prompt_node: int | None = None  # node right before the last assistant turn
    busy: bool = False
    calls: int = 0

    def truncate(self, token_len: int, node_count: int) -> int:
        """Cuts back to a boundary; returns how many trainable (mask-1) tokens were dropped."""
        dropped = sum(self.mask[token_len:])
        del (
            self.tokens[token_len:],
            self.mask[token_len:],
            self.logprobs[token_len:],
            self.versions[token_len:],
        )
        del self.nodes[node_count:]
        if self.last_prompt_node is not None and self.last_prompt_node >= node_count:
            self.last_prompt_node = None
        return dropped

    def append(
        self,
        ids: list[int],
        trainable: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        self.tokens.extend(ids)
        self.mask.extend([1 if trainable else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.versions.extend(versions if versions is not None else [-1] * len(ids))


@dataclass
class CallPlan:
    op: ChainOp
    chain: Chain
    parent_chain_id: str | None
    base_len: int
    base_nodes: int
    inherited_ids: list[int]  # new/fork: the token prefix the new chain starts with (mask 0)
    inherited_nodes: list[Node]
    delta_ids: list[int]  # rendering of the new messages + generation prompt (mask 0)
    new_nodes: list[Node]
    prompt_ids: list[int]
    prompt_cum: bytes  # chained hash of the request's messages
    discarded_trainable: int
    # extend: the delta is appended to the chain's token buffer in place and `prompt_ids` IS that buffer
    # (no O(history) copy per call); undone before the record is applied, or when the call fails
    tentative: bool = False


STARTS_CHAIN = (ChainOp.NEW, ChainOp.FORK)


def apply_call(chains: dict[str, Chain], rec: CallRecord) -> Chain:
    """Applies one journaled call record to the chain state (live commit, recovery and export share this)."""
    cid = rec.chain_id
    if rec.op in STARTS_CHAIN:
        chain = Chain(cid)
        chain.append(rec.inherited_ids, trainable=False)
        chain.nodes = list(rec.inherited_nodes)
        chains[cid] = chain
    else:
        chain = chains[cid]
        chain.truncate(rec.base_len, rec.base_nodes)
    chain.append(rec.delta_ids, trainable=False)
    chain.nodes.extend(rec.new_nodes)
    chain.last_prompt_node = len(chain.nodes) - 1
    chain.append(
        rec.completion_ids, trainable=True, logprobs=rec.completion_logprobs, versions=rec.completion_versions
    )
    chain.append(rec.close_ids, trainable=False)
    chain.nodes.append(Node(rec.assistant_cum, len(chain.tokens), NodeKind.ASSISTANT))
    chain.calls += 1
    return chain


class ChainSet:
    """The chains of one session and the hash index used to match requests to them."""

    def __init__(
        self, renderer: ChatRenderer, hasher: MessageHasher, rollback_any_depth: bool = False
    ) -> None:
        self.renderer = renderer
        self.hasher = hasher
        self.rollback_any_depth = rollback_any_depth
        self.chains: dict[str, Chain] = {}
        self._index: dict[bytes, list[tuple[Chain, int]]] = {}

    # -- index ------------------------------------------------------------------------------------------
    def index_chain(self, chain: Chain, start: int = 0) -> None:
        for i in range(start, len(chain.nodes)):
            entries = self._index.setdefault(chain.nodes[i].cum, [])
            entries[:] = [(c, j) for (c, j) in entries if self._valid(c, j, chain.nodes[i].cum)]
            entries.append((chain, i))

    @staticmethod
    def _valid(chain: Chain, i: int, cum: bytes) -> bool:
        return i < len(chain.nodes) and chain.nodes[i].cum == cum

    def _lookup(self, cum: bytes) -> list[tuple[Chain, int]]:
        return [(c, i) for (c, i) in self._index.get(cum, ()) if self._valid(c, i, cum)]

    def release(self, plan: CallPlan) -> None:
        """Ends the reservation of a planned call (after commit, or when the call failed)."""
        if plan.tentative:
            del plan.chain.tokens[plan.base_len :]
            plan.tentative = False
        plan.chain.busy = False

    def commit(self, rec: CallRecord, plan: CallPlan | None = None) -> Chain:
        if plan is not None and plan.tentative:
            del plan.chain.tokens[plan.base_len :]
            plan.tentative = False
        before = len(self.chains[rec.chain_id].nodes) if rec.chain_id in self.chains else 0
        base = 0 if rec.op in STARTS_CHAIN else rec.base_nodes
        chain = apply_call(self.chains, rec)
        self.index_chain(chain, start=min(before, base))
        return chain

    # -- planning ---------------------------------------------------------------------------------------
    def plan(self, msgs: list[Msg], tools: list[dict]) -> CallPlan:
        """Decides extend / rollback / new chain and computes the prompt; reserves the chain it extends."""
        cums = self.hasher.chain(self.hasher.seed(tools), msgs)
        n = len(msgs)
        k, cands = 0, []
        for k in range(n, 0, -1):
            cands = self._lookup(cums[k])
            if cands:
                break
        if not cands:
            return self._new_chain(msgs, tools, cums)

        for chain, i in cands:
            if not chain.busy and i == len(chain.nodes) - 1:
                return self._continue(chain, ChainOp.EXTEND, i, msgs[k:], tools, cums, k)
        for chain, i in cands:
            lp = chain.last_prompt_node
            if not chain.busy and lp is not None and (i == lp or (self.rollback_any_depth and i < lp)):
                if i == lp and self._moves_past_executed_turn(chain, msgs[k:]):
                    continue
                return self._continue(chain, ChainOp.ROLLBACK, i, msgs[k:], tools, cums, k)
        parent, i = cands[0]
        return self._fork(parent, i, msgs[k:], tools, cums, k)

    def _moves_past_executed_turn(self, chain: Chain, new_msgs: list[Msg]) -> bool:
        """A request that leaves out the chain's last reply, whose tool calls the harness ran, and goes on with
        new non-assistant messages is a side call from an earlier point (Claude Code's compaction: the history
        before its last turn plus "summarize"), not a retry: it forks a chain of its own and the executed turn
        keeps its sampled tokens. A retry (no new messages), a rewritten reply (an assistant message in its
        place) and a reply the harness could not act on (no tool calls: mini-swe-agent's format errors) still
        roll back."""
        if not new_msgs or new_msgs[0].role == "assistant" or chain.last_prompt_node is None:
            return False
        start = chain.nodes[chain.last_prompt_node].token_len
        sampled = [t for t, m in zip(chain.tokens[start:], chain.mask[start:], strict=True) if m]
        return bool(self.renderer.parse_completion(self.renderer.completion_text(sampled))[1])

    def _render_delta(
        self, new_msgs: list[Msg], tools: list[dict], start_len: int, cums: list[bytes], k: int
    ) -> tuple[list[int], list[Node]]:
        delta: list[int] = []
        nodes: list[Node] = []
        for j, m in enumerate(new_msgs):
            delta.extend(self.renderer.message_delta(m, tools))
            nodes.append(Node(cums[k + j + 1], start_len + len(delta), NodeKind.MESSAGE))
        delta.extend(self.renderer.generation_prompt_ids)
        return delta, nodes

    def _continue(
        self,
        chain: Chain,
        op: ChainOp,
        i: int,
        new_msgs: list[Msg],
        tools: list[dict],
        cums: list[bytes],
        k: int,
    ) -> CallPlan:
        base_len = chain.nodes[i].token_len
        delta, nodes = self._render_delta(new_msgs, tools, base_len, cums, k)
        chain.busy = True
        if op is ChainOp.EXTEND and base_len == len(chain.tokens):
            chain.tokens.extend(delta)
            return CallPlan(
                op,
                chain,
                None,
                base_len,
                i + 1,
                [],
                [],
                delta,
                nodes,
                chain.tokens,
                cums[-1],
                0,
                tentative=True,
            )
        dropped = sum(chain.mask[base_len:]) if op is ChainOp.ROLLBACK else 0
        prompt = chain.tokens[:base_len] + delta
        return CallPlan(op, chain, None, base_len, i + 1, [], [], delta, nodes, prompt, cums[-1], dropped)

    def _fork(
        self, parent: Chain, i: int, new_msgs: list[Msg], tools: list[dict], cums: list[bytes], k: int
    ) -> CallPlan:
        base_len = parent.nodes[i].token_len
        inherited = parent.tokens[:base_len]
        inherited_nodes = [Node(nd.cum, nd.token_len, nd.kind) for nd in parent.nodes[: i + 1]]
        delta, nodes = self._render_delta(new_msgs, tools, base_len, cums, k)
        chain = Chain(new_chain_id(), busy=True)
        return CallPlan(
            ChainOp.FORK,
            chain,
            parent.chain_id,
            base_len,
            0,
            inherited,
            inherited_nodes,
            delta,
            nodes,
            inherited + delta,
            cums[-1],
            0,
        )

    def _new_chain(self, msgs: list[Msg], tools: list[dict], cums: list[bytes]) -> CallPlan:
        base = self.renderer.full_prompt(msgs, tools, add_generation_prompt=False)
        nodes = [Node(cums[0], 0, NodeKind.SEED), Node(cums[-1], len(base), NodeKind.MESSAGE)]
        delta = list(self.renderer.generation_prompt_ids)
        chain = Chain(new_chain_id(), busy=True)
        return CallPlan(ChainOp.NEW, chain, None, 0, 0, base, nodes, delta, [], base + delta, cums[-1], 0)


def new_chain_id() -> str:
    return "ch-" + uuid.uuid4().hex[:12]
