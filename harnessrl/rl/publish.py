"""Weights from the trainer into the engines after an optimizer step, the way `RLConfig.weight_sync` says.

- `InProcessPublisher` (`checkpoint` mode, an engine in the trainer's process: the LocalEngine, one replica):
  the trainer's tensors themselves, copied by the engine into its own between two decode steps. No file, and
  no copy beside the two models: writing a checkpoint (safetensors serializes every tensor to bytes first) and
  reading it back (mapped into the process) added ~1 GB to the tiny model's RL stage at every sync.
- `CheckpointPublisher`: safetensors under `OUT/work/sync/vNNNNNN` (the previous one removed), then
  `engine.load_weights(path, version)`: every engine must read that path (one machine, or a shared volume).
- `BroadcastPublisher`: the trainer (rank 0) and every engine worker form one process group (nccl when the
  trainer's weights are on a GPU, gloo otherwise; `harnessrl.engine.broadcast`); each sync the engines' receive
  calls go out and the trainer broadcasts the tensors in buckets, each announced by its names, dtypes and shapes.
  The engines apply the update, flush their prefix caches and move their policy version. Nothing is written to
  disk, so remote engines need no shared volume.

`publish(version, named_tensors)` runs on trainer rank 0 and returns its seconds; `named_tensors` is consumed
once, in order (a generator of gathered tensors is fine). Each also has `publish_adapter(version, adapter)`
a LoRA run's adapter alone — in memory, as a PEFT directory, or broadcast — merged by
every engine onto its base weights.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import shutil
import threading
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from harnessrl.engine.base import (
    BroadcastEngine,
    InProcessEngine,
    WeightLoadingEngine,
    WeightSyncMode,
    WeightSyncUnsupported,
)

if TYPE_CHECKING:
    import torch

    from harnessrl.engine.broadcast import WeightGroup
    from harnessrl.train.lora import Adapter, LoraSettings

logger = logging.getLogger(__name__)


class WeightPublisher(Protocol):
    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float: ...

    def publish_adapter(self, version: int, adapter: Adapter) -> float: ...

    def close(self) -> None: ...


class _Runner:
    """Runs engine coroutines on the gateway's event loop (an HTTP engine's connections live there), or on a
    loop of its own when there is none."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._own: asyncio.AbstractEventLoop | None = None
        if loop is None:
            self._own = loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="harnessrl-publish", daemon=True).start()
        self.loop = loop

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.submit(coro).result()

    def close(self) -> None:
        if self._own is not None:
            self._own.call_soon_threadsafe(self._own.stop)
            self._own = None


class InProcessPublisher:
    """The trainer's tensors straight into an engine of this process (blocks until the engine applied them)."""

    def __init__(self, engine: InProcessEngine) -> None:
        self.engine = engine

    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        t0 = time.perf_counter()
        self.engine.load_state_sync({name: tensor.detach() for name, tensor in named_tensors}, version)
        return time.perf_counter() - t0

    def publish_adapter(self, version: int, adapter: Adapter) -> float:
        t0 = time.perf_counter()
        self.engine.load_adapter_sync(adapter, version)
        return time.perf_counter() - t0

    def close(self) -> None:
        pass


class CheckpointPublisher:
    """Today's path: a Hugging Face directory the engines load (`model` gives the layout, e.g. tied weights)."""

    def __init__(
        self,
        engine: WeightLoadingEngine,
        model: Any,
        root: Path,
        fingerprint: str,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.engine, self.model, self.root, self.fingerprint = engine, model, root, fingerprint
        self._runner = _Runner(loop)
        self._last: Path | None = None

    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        from harnessrl.train.checkpoint import save_model

        t0 = time.perf_counter()
        dest = self.root / f"v{version:06d}"
        state = {name: tensor.detach().cpu() for name, tensor in named_tensors}
        save_model(self.model, None, dest, self.fingerprint, state_dict=state)
        self._runner.run(self.engine.load_weights(str(dest), version))
        self._replace_last(dest)
        return time.perf_counter() - t0

    def publish_adapter(self, version: int, adapter: Adapter) -> float:
        """The adapter alone, in PEFT's layout, merged by every engine onto its base."""
        from harnessrl.train.lora import base_name

        t0 = time.perf_counter()
        dest = adapter.save(self.root / f"v{version:06d}", base_name(self.model.config.name_or_path))
        self._runner.run(self.engine.load_adapter(str(dest), version))
        self._replace_last(dest)
        return time.perf_counter() - t0

    def _replace_last(self, dest: Path) -> None:
        if self._last is not None:
            shutil.rmtree(self._last, ignore_errors=True)
        self._last = dest

    def close(self) -> None:
        self._runner.close()


def trainer_address(engine: BroadcastEngine) -> str:
    """Where the engines reach the trainer: 127.0.0.1 when they all run here, else this machine's address
    on the route to the first remote one."""
    from harnessrl.engine.broadcast import route_address

    hosts = [urlparse(u).hostname or "127.0.0.1" for u in engine.endpoints()]
    addresses = {route_address(h) for h in hosts}
    remote = sorted(a for a in addresses if a != "127.0.0.1")
    return remote[0] if remote else "127.0.0.1"


class BroadcastPublisher:
    """Rank 0 of a broadcast group with every engine worker; the group is formed at the first publish (or
    `join()`) and kept for the run. `device`: where the trainer's weights are (picks nccl or gloo)."""

    def __init__(
        self,
        engine: BroadcastEngine,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        name: str = "engine",
        device: Any = "cpu",
        backend: str | None = None,
        address: str | None = None,
        bucket_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        from harnessrl.engine.broadcast import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S, default_backend

        self.engine, self.name, self.device = engine, name, device
        self.backend = backend or default_backend(device)
        self.address = address
        self.bucket_bytes = bucket_bytes or DEFAULT_BUCKET_BYTES
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self._runner = _Runner(loop)
        self.group: WeightGroup | None = None
        self.join_s = 0.0  # seconds the group took to form (in the first publish)

    def join(self) -> WeightGroup:
        from harnessrl.engine.broadcast import WeightGroup
        from harnessrl.engine.vllm_worker import BroadcastInit
        from harnessrl.engine.weight_sync import ensure_weight_sync

        t0 = time.perf_counter()
        self._runner.run(ensure_weight_sync(self.engine, self.name, WeightSyncMode.BROADCAST))
        world_size = 1 + self.engine.workers
        address = self.address or trainer_address(self.engine)
        store = WeightGroup.host_store(address, self.timeout_s)
        init = BroadcastInit(address, int(store.port), 1, world_size, str(self.backend))
        joining = self._runner.submit(self.engine.init_weight_broadcast(init))
        group = WeightGroup(
            address, int(store.port), 0, world_size, self.backend, self.device, self.timeout_s, store=store
        )
        joining.result(timeout=self.timeout_s)
        self.group = group
        self.join_s = time.perf_counter() - t0
        logger.info(
            "weight broadcast group: %d ranks over %s at %s:%d (%.2f s)",
            world_size,
            self.backend,
            address,
            store.port,
            self.join_s,
        )
        return group

    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        return self._broadcast(version, named_tensors, None)

    def publish_adapter(self, version: int, adapter: Adapter) -> float:
        """The adapter's tensors alone (PEFT's names); every engine merges them onto its base."""
        return self._broadcast(version, adapter.named_tensors(), adapter.settings)

    def _broadcast(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], adapter: LoraSettings | None
    ) -> float:
        t0 = time.perf_counter()
        try:
            self._send(version, named_tensors, adapter)
        except BaseException:
            self._drop_group()  # a half-done update leaves the group's state unknown: form it again next time
            raise
        return time.perf_counter() - t0

    def _send(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], adapter: LoraSettings | None
    ) -> None:
        from harnessrl.engine.broadcast import send_weights

        if self.group is not None and self.group.world_size != 1 + self.engine.workers:
            self._drop_group()  # a replica went down or came back (a router's failover): form the group again
        group = self.group or self.join()
        receiving = self._runner.submit(self.engine.receive_weights_broadcast(version, adapter))

        def failed() -> BaseException | None:
            return receiving.exception() if receiving.done() else None

        group.wait_ready(str(version), failed, self.timeout_s)
        send_weights(group, named_tensors, self.bucket_bytes)
        receiving.result(timeout=self.timeout_s)

    def _drop_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def close(self) -> None:
        self._drop_group()
        self._runner.close()


def make_publisher(
    mode: WeightSyncMode,
    engine: WeightLoadingEngine,
    loop: asyncio.AbstractEventLoop | None,
    *,
    model: Any,
    sync_root: Path,
    fingerprint: str,
    name: str = "engine",
) -> WeightPublisher:
    if WeightSyncMode(mode) is WeightSyncMode.BROADCAST:
        if not isinstance(engine, BroadcastEngine):
            raise WeightSyncUnsupported(f"{name}: {engine!r} cannot join a weight broadcast")
        device = next(model.parameters()).device
        return BroadcastPublisher(engine, loop, name=name, device=device)
    if isinstance(engine, InProcessEngine):
        return InProcessPublisher(engine)
    return CheckpointPublisher(engine, model, sync_root, fingerprint, loop)
