"""Routing requests across engine replicas: one `Router` (itself an `Engine`) in front of several.

Routing strategies
- `round_robin`: replicas in turn.
- `least_inflight`: the verl-like baseline: a session sticks to the replica it first went to; a new session
  goes to the replica with the fewest requests in flight. Stickiness never breaks.
- `cache_aware_token_load`: load is counted in tokens, not requests: for every request in flight, the prompt
  tokens the replica must still prefill (not in its prefix cache) plus the tokens it may decode
  (`max_tokens`). A session's request goes to the replica holding its prefix while that replica's load plus
  this request's cost stays under `threshold` × capacity; otherwise stickiness breaks and the request goes
  to the replica where (load + uncached prefill + decode) / capacity is lowest. Residency is tracked per
  session as the token prefix the replica last saw (prompt, and prompt + sampled tokens), evicted LRU beyond
  the replica's KV capacity, and forgotten at every weight sync (prefix caches are flushed then).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from harnessrl.engine.base import (
    BroadcastEngine,
    Engine,
    EngineStats,
    Generation,
    SamplingParams,
    WeightLoadingEngine,
    WeightSyncMode,
    WeightSyncUnsupported,
)

if TYPE_CHECKING:
    from harnessrl.engine.vllm_worker import BroadcastInit
    from harnessrl.train.lora import LoraSettings


class RoutingStrategyName(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_INFLIGHT = "least_inflight"
    CACHE_AWARE_TOKEN_LOAD = "cache_aware_token_load"


def prefix_hash(tokens: list[int], length: int) -> bytes:
    return hashlib.blake2b(array("q", tokens[:length]).tobytes(), digest_size=16).digest()


@dataclass
class Residency:
    """What a replica (probably) still holds of one session: prefixes by (length, hash)."""

    prefixes: list[tuple[int, bytes]]

    @property
    def tokens(self) -> int:
        return max(length for length, _ in self.prefixes)


@dataclass
class ReplicaState:
    capacity_tokens: int
    inflight: int = 0
    token_load: int = 0  # uncached prefill + max decode tokens of the requests in flight
    residency: OrderedDict[str, Residency] = field(default_factory=OrderedDict)
    resident_tokens: int = 0

    def cached_prefix(self, session_id: str | None, prompt_ids: list[int]) -> int:
        """How many leading tokens of `prompt_ids` this replica holds for the session (0 if none)."""
        entry = self.residency.get(session_id) if session_id is not None else None
        if entry is None:
            return 0
        for length, digest in sorted(entry.prefixes, reverse=True):
            if length <= len(prompt_ids) and prefix_hash(prompt_ids, length) == digest:
                return length
        return 0

    def remember(self, session_id: str, prefixes: list[tuple[int, bytes]]) -> None:
        old = self.residency.pop(session_id, None)
        if old is not None:
            self.resident_tokens -= old.tokens
        entry = Residency(prefixes)
        self.residency[session_id] = entry
        self.resident_tokens += entry.tokens
        while self.resident_tokens > self.capacity_tokens and len(self.residency) > 1:
            _, evicted = self.residency.popitem(last=False)  # least recently used
            self.resident_tokens -= evicted.tokens

    def forget_all(self) -> None:
        self.residency.clear()
        self.resident_tokens = 0


@dataclass(frozen=True)
class RouteRequest:
    prompt_ids: list[int]
    max_tokens: int
    session_id: str | None = None


class RoutingStrategy(Protocol):
    name: RoutingStrategyName

    def choose(self, replicas: list[ReplicaState], request: RouteRequest) -> int: ...


class RoundRobin:
    name = RoutingStrategyName.ROUND_ROBIN

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, replicas: list[ReplicaState], request: RouteRequest) -> int:
        return next(self._next) % len(replicas)


class LeastInflight:
    name = RoutingStrategyName.LEAST_INFLIGHT

    def __init__(self) -> None:
        self.sticky: dict[str, int] = {}

    def choose(self, replicas: list[ReplicaState], request: RouteRequest) -> int:
        if request.session_id is not None and request.session_id in self.sticky:
            return self.sticky[request.session_id]
        choice = min(range(len(replicas)), key=lambda i: (replicas[i].inflight, i))
        if request.session_id is not None:
            self.sticky[request.session_id] = choice
        return choice


class CacheAwareTokenLoad:
    name = RoutingStrategyName.CACHE_AWARE_TOKEN_LOAD

    def __init__(self, threshold: float = 0.8) -> None:
        if not 0 < threshold:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        self.threshold = threshold
        self.sticky_hits = 0
        self.sticky_breaks = 0

    def cost(self, replica: ReplicaState, request: RouteRequest) -> int:
        """Tokens this request adds to the replica: uncached prefill + decode budget."""
        cached = replica.cached_prefix(request.session_id, request.prompt_ids)
        return len(request.prompt_ids) - cached + request.max_tokens

    def choose(self, replicas: list[ReplicaState], request: RouteRequest) -> int:
        cached = [r.cached_prefix(request.session_id, request.prompt_ids) for r in replicas]
        costs = [len(request.prompt_ids) - c + request.max_tokens for c in cached]
        utilization = [
            (r.token_load + cost) / r.capacity_tokens for r, cost in zip(replicas, costs, strict=True)
        ]
        if max(cached) > 0:
            home = max(range(len(replicas)), key=lambda i: (cached[i], -i))
            if utilization[home] <= self.threshold:
                self.sticky_hits += 1
                return home
            self.sticky_breaks += 1
        # ties: fewer requests in flight, then fewer resident tokens (spread sessions over the caches)
        return min(
            range(len(replicas)),
            key=lambda i: (utilization[i], replicas[i].inflight, replicas[i].resident_tokens, i),
        )


def make_strategy(name: str, **options: Any) -> RoutingStrategy:
    if name == RoutingStrategyName.ROUND_ROBIN:
        return RoundRobin()
    if name == RoutingStrategyName.LEAST_INFLIGHT:
        return LeastInflight()
    if name == RoutingStrategyName.CACHE_AWARE_TOKEN_LOAD:
        return CacheAwareTokenLoad(**options)
    raise ValueError(f"unknown routing strategy {name!r}; choose one of {', '.join(RoutingStrategyName)}")


class Router(BroadcastEngine):
    """An `Engine` that spreads requests over replica engines with a routing strategy.

    `capacity_tokens`: per replica, the KV tokens it can hold (one int, or one per replica).
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        strategy: str | RoutingStrategy = RoutingStrategyName.CACHE_AWARE_TOKEN_LOAD,
        *,
        capacity_tokens: int | list[int] = 65536,
        **strategy_options: Any,
    ) -> None:
        if not engines:
            raise ValueError("Router needs at least one engine")
        capacities = (
            capacity_tokens if isinstance(capacity_tokens, list) else [capacity_tokens] * len(engines)
        )
        if len(capacities) != len(engines):
            raise ValueError(f"{len(capacities)} capacities for {len(engines)} engines")
        self.engines = list(engines)
        self.replicas = [ReplicaState(capacity_tokens=c) for c in capacities]
        self.strategy = make_strategy(strategy, **strategy_options) if isinstance(strategy, str) else strategy
        self.dispatched = [0] * len(engines)

    def route(self, request: RouteRequest) -> int:
        return self.strategy.choose(self.replicas, request)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        *,
        session_id: str | None = None,
        **options: Any,
    ) -> Generation:
        request = RouteRequest(list(prompt_ids), int(max_tokens), session_id)
        index = self.route(request)
        replica = self.replicas[index]
        cost = len(prompt_ids) - replica.cached_prefix(session_id, request.prompt_ids) + max_tokens
        replica.inflight += 1
        replica.token_load += cost
        self.dispatched[index] += 1
        try:
            generation = await self.engines[index].generate(
                prompt_ids, sampling, max_tokens, stop_token_ids, **options
            )
        finally:
            replica.inflight -= 1
            replica.token_load -= cost
        if session_id is not None:
            full = request.prompt_ids + generation.token_ids
            replica.remember(
                session_id,
                [
                    (len(request.prompt_ids), prefix_hash(full, len(request.prompt_ids))),
                    (len(full), prefix_hash(full, len(full))),
                ],
            )
        return generation

    def reset_residency(self) -> None:
        """Forget what every replica caches (call at every weight sync: prefix caches are flushed)."""
        for replica in self.replicas:
            replica.forget_all()

    async def check_weight_sync(self, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT) -> None:
        """Every replica is asked; the first that cannot names itself."""
        results = await asyncio.gather(
            *(_check_replica(e, mode) for e in self.engines), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if not isinstance(r, WeightSyncUnsupported):
                raise r
        if failed:
            more = f" (and {len(failed) - 1} more of {len(results)} replicas)" if len(failed) > 1 else ""
            raise WeightSyncUnsupported(f"router replica {failed[0]}{more}")

    def _loaders(self) -> list[WeightLoadingEngine]:
        return [e for e in self.engines if isinstance(e, WeightLoadingEngine)]

    def _receivers(self) -> list[BroadcastEngine]:
        return [e for e in self.engines if isinstance(e, BroadcastEngine)]

    async def load_weights(self, checkpoint_dir: str, version: int) -> None:
        await self._on_every_replica(lambda e: e.load_weights(checkpoint_dir, version))

    async def load_adapter(self, adapter_dir: str, version: int) -> None:
        await self._on_every_replica(lambda e: e.load_adapter(adapter_dir, version))

    async def _on_every_replica(self, load: Callable[[WeightLoadingEngine], Awaitable[None]]) -> None:
        """New weights into every replica at once; no replica keeps a session's cache residency after."""
        loaders = self._loaders()
        if len(loaders) != len(self.engines):
            raise WeightSyncUnsupported(f"{len(self.engines) - len(loaders)} replica(s) cannot load weights")
        try:
            await asyncio.gather(*(load(e) for e in loaders))
        finally:
            self.reset_residency()

    @property
    def workers(self) -> int:
        """Ranks the replicas bring to a weight broadcast (known once check_weight_sync asked them)."""
        return sum(e.workers for e in self._receivers())

    def endpoints(self) -> list[str]:
        return [url for e in self._receivers() for url in e.endpoints()]

    async def init_weight_broadcast(self, init: BroadcastInit) -> list[Any]:
        """Every replica joins the trainer's broadcast group, at consecutive ranks from `init.rank_offset`."""
        calls, offset = [], int(init.rank_offset)
        for engine in self._receivers():
            calls.append(engine.init_weight_broadcast(replace(init, rank_offset=offset)))
            offset += engine.workers
        return [answer for answers in await asyncio.gather(*calls) for answer in answers]

    async def receive_weights_broadcast(self, version: int, adapter: LoraSettings | None = None) -> None:
        """Every replica receives the same broadcast (one update: the trainer sends it once)."""
        try:
            await asyncio.gather(*(e.receive_weights_broadcast(version, adapter) for e in self._receivers()))
        finally:
            self.reset_residency()

    async def abort(self, request_ids: list[str] | None = None) -> bool:
        """Aborts on every replica; True when every one could."""
        return all(await asyncio.gather(*(e.abort(request_ids) for e in self.engines)))

    async def stats(self) -> EngineStats | None:
        """The replicas' counters summed; None when a replica reports none."""
        parts = await asyncio.gather(*(e.stats() for e in self.engines))
        known = [p for p in parts if p is not None]
        return EngineStats.total(known) if len(known) == len(parts) else None

    async def context_length(self) -> int | None:
        lengths = await asyncio.gather(*(e.context_length() for e in self.engines))
        known = [n for n in lengths if n is not None]
        return min(known) if known else None

    async def release(self) -> None:
        await asyncio.gather(*(e.release() for e in self.engines))


async def _check_replica(engine: Engine, mode: WeightSyncMode) -> None:
    if not isinstance(engine, WeightLoadingEngine):
        raise WeightSyncUnsupported(f"{engine!r} cannot take new weights")
    await engine.check_weight_sync(mode)  # its own answer first: it names the fix
    if mode is WeightSyncMode.BROADCAST and not isinstance(engine, BroadcastEngine):
        raise WeightSyncUnsupported(f"{engine!r} cannot join a weight broadcast")
