"""New weights into a running vLLM, through vLLM's documented RL hook: a worker extension.

Start vLLM with `--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension`: vLLM mixes the class
into its worker class, so in each method `self` is the worker (`self.model_runner.model` is the served model,
whose `load_weights(weights=...)` maps checkpoint names onto vLLM's own, fused parameters; `self.device` its
device). The methods are reached with `collective_rpc(method, args=(request_json,))`, which runs them on every
worker (tensor-parallel rank) and returns one answer per worker:
- over HTTP: `POST /collective_rpc {"method": ..., "args": ["<json>"]}` (dev endpoints: VLLM_SERVER_DEV_MODE=1;
  vLLM passes only string arguments over HTTP, hence one JSON string) — `HTTPEngine.load_weights` does this;
- in process or in a Ray actor holding `LLM` / `AsyncLLM`: the same call on the engine (`sync_in_process`).

Two ways in: `harnessrl_load_weights` reads a checkpoint directory of safetensors (a local path, or `s3://`
fetched with harnessrl.store: every replica pulls what the trainer wrote), and the NCCL fast path
(`harnessrl_init_broadcast` once: a process group with the trainer as rank 0, built the way vLLM's RLHF
examples do with StatelessProcessGroup + PyNcclCommunicator; then `harnessrl_receive_weights` per sync: the
trainer broadcasts each tensor, named in the request with its dtype and shape, see `BroadcastSender`). The
caller pauses generation around the update and resets the prefix cache after it (engine-level, not worker,
operations). vllm, torch and CUDA are imported inside functions only: this module imports anywhere.
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PROTOCOL = 1  # bumped when a method's arguments or answer change
INFO = "harnessrl_weight_sync_info"
LOAD = "harnessrl_load_weights"
INIT_BROADCAST = "harnessrl_init_broadcast"
RECEIVE = "harnessrl_receive_weights"
CLOSE_BROADCAST = "harnessrl_close_broadcast"
EXTENSION = "harnessrl.WeightSyncExtension"  # what `INFO` answers in "extension"


class WeightSyncRequestError(ValueError):
    """A collective_rpc request the extension cannot read (names the field)."""


def _fields(request: str, names: Sequence[str]) -> dict[str, Any]:
    try:
        body = json.loads(request)
    except (TypeError, json.JSONDecodeError) as e:
        raise WeightSyncRequestError(f"request is not a JSON string ({e}): {str(request)[:200]!r}") from e
    if not isinstance(body, dict):
        raise WeightSyncRequestError(f"request must be a JSON object, got {type(body).__name__}")
    missing = [n for n in names if n not in body]
    if missing:
        raise WeightSyncRequestError(f"request lacks {', '.join(missing)}")
    return body


def _int(body: dict[str, Any], name: str) -> int:
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise WeightSyncRequestError(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class LoadRequest:
    path: str  # checkpoint directory of *.safetensors: local path or s3://bucket/prefix
    version: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, request: str) -> LoadRequest:
        body = _fields(request, ("path", "version"))
        if not isinstance(body["path"], str) or not body["path"]:
            raise WeightSyncRequestError(f"path must be a non-empty string, got {body['path']!r}")
        return cls(body["path"], _int(body, "version"))


@dataclass(frozen=True)
class BroadcastInit:
    master_address: str
    master_port: int
    rank_offset: int  # rank of this engine's first worker (the trainer is 0; engine i at 1 + i × its workers)
    world_size: int  # trainer + every worker of every engine that joins

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, request: str) -> BroadcastInit:
        body = _fields(request, ("master_address", "master_port", "rank_offset", "world_size"))
        return cls(
            str(body["master_address"]),
            _int(body, "master_port"),
            _int(body, "rank_offset"),
            _int(body, "world_size"),
        )


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint (Hugging Face) name; the model's load_weights maps it
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ReceiveRequest:
    tensors: tuple[TensorSpec, ...]  # in the order the trainer broadcasts them
    version: int

    def to_json(self) -> str:
        return json.dumps(
            {"tensors": [[t.name, t.dtype, list(t.shape)] for t in self.tensors], "version": self.version}
        )

    @classmethod
    def from_json(cls, request: str) -> ReceiveRequest:
        body = _fields(request, ("tensors", "version"))
        rows = body["tensors"]
        if not isinstance(rows, list) or not rows:
            raise WeightSyncRequestError("tensors must be a non-empty list of [name, dtype, shape]")
        specs = []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)):
                raise WeightSyncRequestError(f"tensors: expected [name, dtype, shape], got {row!r}")
            specs.append(TensorSpec(row[0], str(row[1]), tuple(int(d) for d in row[2])))
        return cls(tuple(specs), _int(body, "version"))


def tensor_specs(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in named)


def checkpoint_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"{directory}: no *.safetensors files; expected a checkpoint directory written by the trainer "
            "(save_pretrained)"
        )
    return files


def iter_safetensors(files: Iterable[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors one at a time (a checkpoint never has to fit in host memory twice)."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_into(model: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, set[str] | None]:
    """`model.load_weights(weights=...)` (vLLM's model API). Returns (tensors passed, parameter names the model
    reports loaded — None where it reports nothing)."""
    count = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal count
        for item in weights:
            count += 1
            yield item

    loaded = model.load_weights(weights=counted())
    return count, set(loaded) if isinstance(loaded, set | frozenset) else None


def check_loaded(model: Any, loaded: set[str] | None, source: str) -> None:
    """Every parameter must come from the update, the check vLLM's loader makes at start-up."""
    if loaded is None:
        return
    missing = sorted({n for n, _ in model.named_parameters()} - loaded)
    if missing:
        raise ValueError(
            f"{source}: {len(missing)} parameters of the served model were not in the update "
            f"(e.g. {missing[:3]}); the engine now mixes two policies: load a complete checkpoint"
        )


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`--worker-extension-cls`). Every method answers a JSON-able dict. Every
    name is prefixed `harnessrl_`: vLLM refuses an extension whose attributes the worker already has."""

    model_runner: Any  # these two are the vLLM worker's (annotations only: nothing shadows them)
    device: Any
    _harnessrl_version: int = 0
    _harnessrl_group: Any = None

    def harnessrl_weight_sync_info(self) -> dict[str, Any]:
        return {"extension": EXTENSION, "protocol": PROTOCOL, "policy_version": self._harnessrl_version}

    def harnessrl_load_weights(self, request: str) -> dict[str, Any]:
        req = LoadRequest.from_json(request)
        model = self.model_runner.model
        staging = None
        try:
            directory = Path(req.path)
            if req.path.startswith(("s3://", "minio://")):
                from harnessrl.store import ObjectStore

                staging = Path(tempfile.mkdtemp(prefix="harnessrl-weights-"))
                directory = staging / "checkpoint"
                ObjectStore.from_env().download_dir(req.path, directory)
            count, loaded = load_into(model, iter_safetensors(checkpoint_files(directory)))
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        check_loaded(model, loaded, req.path)
        self._harnessrl_synchronize()
        self._harnessrl_version = req.version
        return {"policy_version": req.version, "tensors": count}

    def harnessrl_init_broadcast(self, request: str) -> dict[str, Any]:
        from vllm.distributed.parallel_state import get_world_group  # pyright: ignore[reportMissingImports]

        init = BroadcastInit.from_json(request)
        rank = get_world_group().rank + init.rank_offset
        self._harnessrl_group = nccl_group(
            init.master_address, init.master_port, rank, init.world_size, self.device
        )
        return {"rank": rank, "world_size": init.world_size}

    def harnessrl_receive_weights(self, request: str) -> dict[str, Any]:
        import torch

        req = ReceiveRequest.from_json(request)
        group = self._harnessrl_group
        if group is None:
            raise RuntimeError(f"{RECEIVE}: no broadcast group; call {INIT_BROADCAST} first")
        model = self.model_runner.model
        loaded: set[str] | None = set()
        stream = torch.cuda.current_stream() if torch.device(self.device).type == "cuda" else None
        for spec in req.tensors:
            dtype = getattr(torch, spec.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise WeightSyncRequestError(f"{spec.name}: unknown dtype {spec.dtype!r}")
            buffer = torch.empty(spec.shape, dtype=dtype, device=self.device)
            group.broadcast(buffer, src=0, stream=stream)
            _, names = load_into(model, [(spec.name, buffer)])
            loaded = None if loaded is None or names is None else loaded | names
        check_loaded(model, loaded, "broadcast")
        self._harnessrl_synchronize()
        self._harnessrl_version = req.version
        return {"policy_version": req.version, "tensors": len(req.tensors)}

    def harnessrl_close_broadcast(self) -> dict[str, Any]:
        self._harnessrl_group = None
        return {"closed": True}

    def _harnessrl_synchronize(self) -> None:
        import torch

        device = getattr(self, "device", None)
        if device is not None and getattr(device, "type", "cpu") == "cuda":
            torch.cuda.synchronize(device)


def nccl_group(master_address: str, master_port: int, rank: int, world_size: int, device: Any) -> Any:
    """A NCCL communicator over a process group of its own (vLLM's StatelessProcessGroup), so the trainer and
    vLLM's workers meet without touching either side's global torch.distributed group."""
    from vllm.distributed.device_communicators.pynccl import (  # pyright: ignore[reportMissingImports]
        PyNcclCommunicator,
    )
    from vllm.distributed.utils import StatelessProcessGroup  # pyright: ignore[reportMissingImports]

    group = StatelessProcessGroup.create(
        host=master_address, port=master_port, rank=rank, world_size=world_size
    )
    return PyNcclCommunicator(group, device=device)


class BroadcastSender:
    """Trainer side of the NCCL fast path: rank 0 of the group the workers join with `harnessrl_init_broadcast`
    (needs vllm installed on the trainer too, and a GPU other than the engines')."""

    def __init__(self, master_address: str, master_port: int, world_size: int, device: Any) -> None:
        self.group = nccl_group(master_address, master_port, 0, world_size, device)

    def send(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Broadcasts the tensors in the order of the `ReceiveRequest` built from the same iterable."""
        import torch

        count = 0
        for _, tensor in named:
            self.group.broadcast(tensor.contiguous(), src=0, stream=torch.cuda.current_stream())
            count += 1
        torch.cuda.synchronize()
        return count


async def sync_in_process(llm: Any, checkpoint_dir: str, version: int) -> list[dict[str, Any]]:
    """The same update on an engine held in process or in a Ray actor (`vllm.LLM`: plain methods; `AsyncLLM`:
    coroutines): load on every worker, then reset the prefix cache. Returns the workers' answers."""

    async def call(result: Any) -> Any:
        return await result if inspect.isawaitable(result) else result

    answers = await call(llm.collective_rpc(LOAD, args=(LoadRequest(checkpoint_dir, version).to_json(),)))
    await call(llm.reset_prefix_cache())
    return list(answers)
