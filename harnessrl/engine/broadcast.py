"""Weights by broadcast: one process group of the trainer (rank 0) and every engine worker, and the wire format
both sides speak over it.

The group is built from torch.distributed's parts directly (a `TCPStore` the trainer hosts, and a
`ProcessGroupGloo` or `ProcessGroupNCCL` on it), never through the global `init_process_group`, so neither the
trainer's own group nor a vLLM worker's is touched, and the same code runs with gloo on a CPU and with nccl on
GPUs. vllm is not imported here.

Wire format, per bucket: an int64 pair (header bytes, bucket bytes), the header (JSON: `[[name, dtype, shape,
offset], ...]`), then the bucket: the tensors' bytes, each at a 16-byte aligned offset, in one uint8 buffer
(so one collective moves many small tensors, of mixed dtypes). A pair (0, 0) ends the update. The receiver
needs no list of names in advance: the trainer can stream tensors as it gathers them.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from harnessrl.engine.base import EngineError

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 32 * 2**20  # loopback gloo, 512 MB: 16 MB buckets 0.9 s, 64 MB 1.4 s, 256 MB 1.3 s
DEFAULT_TIMEOUT_S = 600.0
_ALIGN = 16
_STORE_PREFIX = "harnessrl-weights"


class Backend(StrEnum):
    GLOO = "gloo"  # CPU tensors (a CPU engine, or tests)
    NCCL = "nccl"  # CUDA tensors, trainer and engine workers on different GPUs


class BroadcastError(EngineError):
    """A broadcast update that cannot go on (a receiver failed, a bad header or dtype, a rank out of range)."""


def default_backend(device: torch.device | str) -> Backend:
    return Backend.NCCL if torch.device(device).type == "cuda" else Backend.GLOO


def route_address(host: str) -> str:
    """This machine's address on the route to `host` (what an engine there can reach the trainer at)."""
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP: no packet is sent, the kernel only picks the route
        return str(s.getsockname()[0])


class WeightGroup:
    """Rank `rank` of a broadcast group of `world_size`; rank 0 (the trainer) hosts the store at `port` (0: a
    free port, read back from `.port`). Constructing it blocks until every rank has joined (gloo) or until the
    store is reached (nccl, which connects at the first broadcast)."""

    def __init__(
        self,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        backend: Backend | str,
        device: torch.device | str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        store: Any = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise BroadcastError(f"rank {rank} outside a group of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.backend = Backend(backend)
        self.device = torch.device("cpu") if self.backend is Backend.GLOO else torch.device(device)
        timeout = datetime.timedelta(seconds=timeout_s)
        from torch.distributed import PrefixStore, TCPStore  # pyright: ignore[reportPrivateImportUsage]

        if store is None:
            store = TCPStore(address, port, None, rank == 0, timeout, wait_for_workers=False)
        self.store = store
        self.port = int(store.port)
        prefixed = PrefixStore(_STORE_PREFIX, store)
        if self.backend is Backend.GLOO:
            from torch.distributed import ProcessGroupGloo

            options = ProcessGroupGloo._Options()  # pyright: ignore[reportAttributeAccessIssue]
            options._timeout = timeout
            # this rank listens on its address on the route to rank 0 (not whatever its host name resolves to,
            # 127.0.1.1 in many containers), unless GLOO_SOCKET_IFNAME names the interface
            options._devices = [
                ProcessGroupGloo.create_default_device()
                if os.environ.get("GLOO_SOCKET_IFNAME")
                else ProcessGroupGloo.create_device(hostname=route_address(address))
            ]
            self.group: Any = ProcessGroupGloo(prefixed, rank, world_size, options)
        else:
            from torch.distributed import ProcessGroupNCCL  # pyright: ignore[reportAttributeAccessIssue]

            if self.device.type != "cuda":
                raise BroadcastError(f"backend nccl needs a CUDA device, got {self.device}")
            options = ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = ProcessGroupNCCL(prefixed, rank, world_size, options)

    @staticmethod
    def host_store(address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """Rank 0's store on a free port (`.port`), made before the group so that the engines can be told the
        port; then `WeightGroup(..., rank=0, store=store)` joins."""
        from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage]

        return TCPStore(address, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)

    def mark_ready(self, tag: str) -> None:
        """A receiver announces that it is about to receive update `tag` (see `wait_ready`)."""
        self.store.set(f"ready/{tag}/{self.rank}", "1")

    def wait_ready(self, tag: str, failed: Callable[[], BaseException | None], timeout_s: float) -> None:
        """Rank 0: waits until every other rank has marked `tag` ready, so that a receiver that never starts
        (its call failed: `failed()` returns the error) fails the update at once instead of leaving the
        sender blocked in a broadcast until the group's timeout."""
        keys = [f"ready/{tag}/{rank}" for rank in range(1, self.world_size)]
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            error = failed()
            if error is not None:
                raise BroadcastError(f"a receiver failed before update {tag} started: {error}") from error
            if time.monotonic() > deadline:
                raise BroadcastError(f"receivers not ready for update {tag} within {timeout_s:.0f} s")
            time.sleep(0.02)

    def broadcast(self, tensor: torch.Tensor) -> None:
        from torch.distributed import BroadcastOptions

        options = BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except RuntimeError as e:  # a peer already gone: nothing left to release
                logger.debug("weight group shutdown: %s", e)


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: str  # torch dtype name without "torch."
    shape: tuple[int, ...]
    offset: int  # byte offset in the bucket

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * _dtype(self.dtype).itemsize


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BroadcastError(f"unknown dtype {name!r} in the broadcast header")
    return dtype


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[Slot, torch.Tensor]]]:
    """Consecutive tensors packed into buckets of at most `bucket_bytes` (a larger tensor gets one of its own)."""
    bucket: list[tuple[Slot, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        slot = Slot(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), size)
        bucket.append((slot, tensor))
        size = _aligned(size + nbytes)
    if bucket:
        yield bucket


def send_weights(
    group: WeightGroup, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> int:
    """Rank 0: broadcasts every tensor (bucketed, header first), then the end marker. Returns the tensor count."""
    device = group.device
    count = 0
    for bucket in buckets(named, bucket_bytes):
        header = json.dumps([[s.name, s.dtype, list(s.shape), s.offset] for s, _ in bucket]).encode()
        last = bucket[-1][0]
        data = torch.empty(last.offset + last.nbytes, dtype=torch.uint8, device=device)
        with torch.no_grad():
            for slot, tensor in bucket:
                target = data[slot.offset : slot.offset + slot.nbytes].view(tensor.dtype)
                target.copy_(tensor.detach().reshape(-1))
        group.broadcast(torch.tensor([len(header), data.numel()], dtype=torch.int64, device=device))
        group.broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device))
        group.broadcast(data)
        count += len(bucket)
    group.broadcast(torch.zeros(2, dtype=torch.int64, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count


def receive_weights(group: WeightGroup, tag: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Any other rank: the tensors of one update as they arrive (views into each bucket, on the group's device),
    until the end marker. `tag`: marked ready first, for a sender that waits (`WeightGroup.wait_ready`)."""
    device = group.device
    if tag is not None:
        group.mark_ready(tag)
    while True:
        sizes = torch.empty(2, dtype=torch.int64, device=device)
        group.broadcast(sizes)
        header_bytes, data_bytes = (int(x) for x in sizes.tolist())
        if header_bytes == 0:
            return
        header = torch.empty(header_bytes, dtype=torch.uint8, device=device)
        group.broadcast(header)
        try:
            rows = json.loads(header.cpu().numpy().tobytes())
            slots = [Slot(str(n), str(d), tuple(int(x) for x in shape), int(o)) for n, d, shape, o in rows]
        except (ValueError, TypeError) as e:
            raise BroadcastError(f"unreadable broadcast header ({e})") from e
        data = torch.empty(data_bytes, dtype=torch.uint8, device=device)
        group.broadcast(data)
        for slot in slots:
            raw = data[slot.offset : slot.offset + slot.nbytes]
            yield slot.name, raw.view(_dtype(slot.dtype)).view(slot.shape)
