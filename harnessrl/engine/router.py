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

Failover: a replica that does not answer (`EngineUnreachable`: connection refused or reset) is marked down at
once — the request goes to another live replica — and so is one whose health check fails (every `probe_s`
seconds, from the first request on). A down replica gets no requests and no weight updates. When it answers
again it is brought to the current policy before it gets requests: the last update by path (checkpoint or
adapter) is replayed into it; after a broadcast it waits, healthy but stale, for the next broadcast (the
publisher forms the group again with it).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, cast

from harnessrl.engine.base import (
    BroadcastEngine,
    Engine,
    EngineError,
    EngineStats,
    EngineUnreachable,
    Generation,
    SamplingParams,
    WeightLoadingEngine,
    WeightSyncMode,
    WeightSyncUnsupported,
)

if TYPE_CHECKING:
    from harnessrl.engine.vllm_worker import BroadcastInit
    from harnessrl.train.lora import LoraSettings


logger = logging.getLogger(__name__)


class ReplicaHealth(StrEnum):
    LIVE = "live"  # gets requests and every weight update
    DOWN = "down"  # did not answer: nothing goes to it; probed until it answers
    STALE = "stale"  # answers again, with older weights: no requests until an update reaches it


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
    health: ReplicaHealth = ReplicaHealth.LIVE

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

    def choose(
        self, replicas: list[ReplicaState], request: RouteRequest, candidates: Sequence[int] | None = None
    ) -> int:
        """The index of the replica to send `request` to, one of `candidates` (None: any)."""
        ...


def _candidates(replicas: list[ReplicaState], candidates: Sequence[int] | None) -> Sequence[int]:
    return range(len(replicas)) if candidates is None else candidates


class RoundRobin:
    name = RoutingStrategyName.ROUND_ROBIN

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(
        self, replicas: list[ReplicaState], request: RouteRequest, candidates: Sequence[int] | None = None
    ) -> int:
        among = _candidates(replicas, candidates)
        return among[next(self._next) % len(among)]


class LeastInflight:
    name = RoutingStrategyName.LEAST_INFLIGHT

    def __init__(self) -> None:
        self.sticky: dict[str, int] = {}

    def choose(
        self, replicas: list[ReplicaState], request: RouteRequest, candidates: Sequence[int] | None = None
    ) -> int:
        among = _candidates(replicas, candidates)
        if request.session_id is not None and self.sticky.get(request.session_id, -1) in among:
            return self.sticky[request.session_id]  # stickiness breaks only when its replica is down
        choice = min(among, key=lambda i: (replicas[i].inflight, i))
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

    def choose(
        self, replicas: list[ReplicaState], request: RouteRequest, candidates: Sequence[int] | None = None
    ) -> int:
        among = _candidates(replicas, candidates)
        cached = {i: replicas[i].cached_prefix(request.session_id, request.prompt_ids) for i in among}
        utilization = {
            i: (replicas[i].token_load + len(request.prompt_ids) - cached[i] + request.max_tokens)
            / replicas[i].capacity_tokens
            for i in among
        }
        if max(cached.values()) > 0:
            home = max(among, key=lambda i: (cached[i], -i))
            if utilization[home] <= self.threshold:
                self.sticky_hits += 1
                return home
            self.sticky_breaks += 1
        # ties: fewer requests in flight, then fewer resident tokens (spread sessions over the caches)
        return min(
            among, key=lambda i: (utilization[i], replicas[i].inflight, replicas[i].resident_tokens, i)
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
    """An `Engine` that spreads requests over replica engines with a routing strategy, and fails over (module
    doc).

    `capacity_tokens`: per replica, the KV tokens it can hold (one int, or one per replica). `probe_s`: seconds
    between health checks of every replica (0: none; a replica is still marked down when a request to it finds
    it gone).
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        strategy: str | RoutingStrategy = RoutingStrategyName.CACHE_AWARE_TOKEN_LOAD,
        *,
        capacity_tokens: int | list[int] = 65536,
        probe_s: float = 2.0,
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
        self.probe_s = probe_s
        self._watcher: asyncio.Task[None] | None = None
        self._updating = asyncio.Lock()  # weight updates and a replica's catch-up, one at a time
        # the last update by path, replayed into a replica that comes back; None: none yet, or a broadcast
        self._last_update: Callable[[WeightLoadingEngine], Awaitable[None]] | None = None
        self._broadcast_since_update = False

    def replica_health(self) -> list[ReplicaHealth]:
        return [r.health for r in self.replicas]

    async def health(self) -> bool:
        """Whether some replica is live."""
        return any(r.health is ReplicaHealth.LIVE for r in self.replicas)

    def _serving(self) -> list[int]:
        """Replicas that take weight updates (all but the down ones)."""
        return [i for i, r in enumerate(self.replicas) if r.health is not ReplicaHealth.DOWN]

    def route(self, request: RouteRequest, exclude: set[int] | frozenset[int] = frozenset()) -> int:
        live = [i for i, r in enumerate(self.replicas) if r.health is ReplicaHealth.LIVE and i not in exclude]
        if not live:
            down = [str(i) for i, r in enumerate(self.replicas) if r.health is not ReplicaHealth.LIVE]
            raise EngineUnreachable(
                f"no live engine replica: {len(self.engines)} replicas, not live: {', '.join(down)} "
                f"({', '.join(map(str, self.replica_health()))}); the router takes them back when they answer"
            )
        return self.strategy.choose(self.replicas, request, live)

    def _mark_down(self, index: int, why: object) -> None:
        replica = self.replicas[index]
        if replica.health is not ReplicaHealth.DOWN:
            logger.warning(
                "engine replica %d (%r) is down (%s): no requests or weight updates go to it until it answers",
                index,
                self.engines[index],
                why,
            )
        replica.health = ReplicaHealth.DOWN
        replica.forget_all()

    def _watch(self) -> None:
        """Starts the health checks on the running loop (the caller's: the gateway's) once."""
        if self.probe_s > 0 and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._probe_forever())

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                await self.probe()
            except Exception:  # a probe must never end the watch
                logger.exception("engine replica health check failed")

    async def probe(self) -> None:
        """Asks every replica whether it answers: a live one that does not goes down; one that answers again
        is brought to the current policy and routed to."""
        answers = await asyncio.gather(*(e.health() for e in self.engines), return_exceptions=True)
        for index, ok in enumerate(answers):
            replica = self.replicas[index]
            if ok is not True:
                if replica.health is not ReplicaHealth.DOWN:
                    self._mark_down(index, "health check failed" if ok is False else ok)
            elif replica.health is ReplicaHealth.DOWN:
                await self._catch_up(index)

    async def _catch_up(self, index: int) -> None:
        engine = self.engines[index]
        async with self._updating:
            if self._broadcast_since_update:
                self.replicas[index].health = ReplicaHealth.STALE  # the next broadcast brings it in
                logger.warning(
                    "engine replica %d answers again; it rejoins at the next weight broadcast", index
                )
                return
            if self._last_update is not None and isinstance(engine, WeightLoadingEngine):
                try:
                    await self._last_update(engine)
                except EngineError as e:
                    self._mark_down(index, f"its catch-up to the current weights failed: {e}")
                    return
            self.replicas[index].health = ReplicaHealth.LIVE
            logger.warning(
                "engine replica %d answers again: it serves the current policy and gets requests", index
            )

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
        self._watch()
        request = RouteRequest(list(prompt_ids), int(max_tokens), session_id)
        tried: set[int] = set()
        while True:  # a replica found gone is marked down and the request goes to another live one
            index = self.route(request, tried)
            replica = self.replicas[index]
            cost = len(prompt_ids) - replica.cached_prefix(session_id, request.prompt_ids) + max_tokens
            replica.inflight += 1
            replica.token_load += cost
            self.dispatched[index] += 1
            try:
                generation = await self.engines[index].generate(
                    prompt_ids, sampling, max_tokens, stop_token_ids, **options
                )
                break
            except EngineUnreachable as e:
                self._mark_down(index, e)
                tried.add(index)
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
        """Every replica that is not down is asked; the first that cannot names itself."""
        results = await asyncio.gather(*(_check_replica(e, mode) for e in self._up()), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if not isinstance(r, WeightSyncUnsupported):
                raise r
        if failed:
            more = f" (and {len(failed) - 1} more of {len(results)} replicas)" if len(failed) > 1 else ""
            raise WeightSyncUnsupported(f"router replica {failed[0]}{more}")

    def _loaders(self) -> list[WeightLoadingEngine]:
        return [e for e in self.engines if isinstance(e, WeightLoadingEngine)]

    def _receivers(self) -> list[tuple[int, BroadcastEngine]]:
        """The replicas a broadcast goes to: every one but the down ones."""
        return [(i, e) for i in self._serving() if isinstance(e := self.engines[i], BroadcastEngine)]

    async def load_weights(self, checkpoint_dir: str, version: int) -> None:
        await self._on_every_replica(lambda e: e.load_weights(checkpoint_dir, version))

    async def load_adapter(self, adapter_dir: str, version: int) -> None:
        await self._on_every_replica(lambda e: e.load_adapter(adapter_dir, version))

    async def _on_every_replica(self, load: Callable[[WeightLoadingEngine], Awaitable[None]]) -> None:
        """New weights into every replica that is not down, at once (one found gone meanwhile goes down and
        catches up when it answers); no replica keeps a session's cache residency after."""
        loaders = self._loaders()
        if len(loaders) != len(self.engines):
            raise WeightSyncUnsupported(f"{len(self.engines) - len(loaders)} replica(s) cannot load weights")
        async with self._updating:
            try:
                await self._update(
                    self._serving(), lambda i: load(cast(WeightLoadingEngine, self.engines[i]))
                )
            finally:
                self.reset_residency()
            self._last_update, self._broadcast_since_update = load, False

    async def _update(self, targets: list[int], call: Callable[[int], Awaitable[Any]]) -> list[Any]:
        """`call(i)` for every target at once; a target found gone goes down; another failure is raised.
        The targets that took it are live. Raises EngineUnreachable when none took it."""
        results = await asyncio.gather(*(call(i) for i in targets), return_exceptions=True)
        for index, result in zip(targets, results, strict=True):
            if isinstance(result, EngineUnreachable):
                self._mark_down(index, result)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, EngineUnreachable):
                raise result
        took = [i for i, r in zip(targets, results, strict=True) if not isinstance(r, BaseException)]
        if not took:
            raise EngineUnreachable(
                f"no engine replica took the weight update: {results[0] if results else 'none live'}"
            )
        for index in took:
            self.replicas[index].health = ReplicaHealth.LIVE
        return [r for r in results if not isinstance(r, BaseException)]

    @property
    def workers(self) -> int:
        """Ranks the replicas that are not down bring to a weight broadcast (known once check_weight_sync
        asked them); when it changes, the publisher forms its group again."""
        return sum(e.workers for _, e in self._receivers())

    def endpoints(self) -> list[str]:
        return [url for _, e in self._receivers() for url in e.endpoints()]

    async def init_weight_broadcast(self, init: BroadcastInit) -> list[Any]:
        """Every replica that is not down joins the trainer's broadcast group, at consecutive ranks from
        `init.rank_offset`."""
        calls, offset = [], int(init.rank_offset)
        for _, engine in self._receivers():
            calls.append(engine.init_weight_broadcast(replace(init, rank_offset=offset)))
            offset += engine.workers
        return [answer for answers in await asyncio.gather(*calls) for answer in answers]

    async def receive_weights_broadcast(self, version: int, adapter: LoraSettings | None = None) -> None:
        """Every replica in the group receives the same broadcast (one update: the trainer sends it once)."""
        receivers = self._receivers()

        async def receive(index: int, engine: BroadcastEngine) -> None:
            try:
                await engine.receive_weights_broadcast(version, adapter)
            except EngineUnreachable as e:
                self._mark_down(index, e)  # the next publish forms the group without it
                raise

        async with self._updating:
            try:  # the first failure fails the update at once: the trainer must not wait on a dead rank
                await asyncio.gather(*(receive(i, e) for i, e in receivers))
            finally:
                self.reset_residency()
            for index, _ in receivers:
                self.replicas[index].health = ReplicaHealth.LIVE
            self._last_update, self._broadcast_since_update = None, True

    def _up(self) -> list[Engine]:
        return [self.engines[i] for i in self._serving()]

    async def abort(self, request_ids: list[str] | None = None) -> bool:
        """Aborts on every replica that is not down; True when every one could."""
        return all(await asyncio.gather(*(e.abort(request_ids) for e in self._up())))

    async def stats(self) -> EngineStats | None:
        """The counters of the replicas that are not down, summed; None when one reports none."""
        parts = await asyncio.gather(*(e.stats() for e in self._up()))
        known = [p for p in parts if p is not None]
        return EngineStats.total(known) if known and len(known) == len(parts) else None

    async def context_length(self) -> int | None:
        lengths = await asyncio.gather(*(e.context_length() for e in self._up()))
        known = [n for n in lengths if n is not None]
        return min(known) if known else None

    async def release(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        await asyncio.gather(*(e.release() for e in self.engines))


async def _check_replica(engine: Engine, mode: WeightSyncMode) -> None:
    if not isinstance(engine, WeightLoadingEngine):
        raise WeightSyncUnsupported(f"{engine!r} cannot take new weights")
    await engine.check_weight_sync(mode)  # its own answer first: it names the fix
    if mode is WeightSyncMode.BROADCAST and not isinstance(engine, BroadcastEngine):
        raise WeightSyncUnsupported(f"{engine!r} cannot join a weight broadcast")
