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
fetched with harnessrl.store: every replica pulls what the trainer wrote), and the broadcast path
(`harnessrl_init_broadcast` once: joins a process group with the trainer as rank 0, nccl on GPUs or gloo,
`harnessrl.engine.broadcast.WeightGroup`; then `harnessrl_receive_weights` per sync: the worker receives the
buckets the trainer broadcasts, each announced by a header of names, dtypes and shapes, and loads every tensor
as it arrives). The caller pauses generation around the update and resets the prefix cache after it
(engine-level, not worker, operations). vllm, torch and CUDA are imported inside functions only: this module
imports anywhere (and never imports vllm itself).
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

PROTOCOL = 2  # bumped when a method's arguments or answer change (2: broadcast with in-band headers)
INFO = "harnessrl_weight_sync_info"
LOAD = "harnessrl_load_weights"
INIT_BROADCAST = "harnessrl_init_broadcast"
RECEIVE = "harnessrl_receive_weights"
CLOSE_BROADCAST = "harnessrl_close_broadcast"
EXTENSION = "harnessrl.WeightSyncExtension"  # what `INFO` answers in "extension"
RECEIVES = ("checkpoint", "broadcast")  # listed by `INFO` and our server's `GET /load_weights`


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
    master_address: str  # where the trainer (rank 0) hosts the group's store
    master_port: int
    rank_offset: int  # this engine's first worker's rank (trainer 0; then the workers of earlier engines)
    world_size: int  # trainer + every worker of every engine that joins
    backend: str = "nccl"  # harnessrl.engine.broadcast.Backend: nccl (GPUs) or gloo

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, request: str) -> BroadcastInit:
        body = _fields(request, ("master_address", "master_port", "rank_offset", "world_size", "backend"))
        if body["backend"] not in ("nccl", "gloo"):
            raise WeightSyncRequestError(f"backend must be nccl or gloo, got {body['backend']!r}")
        return cls(
            str(body["master_address"]),
            _int(body, "master_port"),
            _int(body, "rank_offset"),
            _int(body, "world_size"),
            str(body["backend"]),
        )


@dataclass(frozen=True)
class ReceiveRequest:
    version: int  # the tensors themselves are announced in band, bucket by bucket (engine/broadcast.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, request: str) -> ReceiveRequest:
        return cls(_int(_fields(request, ("version",)), "version"))


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

    model_runner: Any  # these three are the vLLM worker's (annotations only: nothing shadows them)
    device: Any
    rank: int  # the worker's rank within its engine (vLLM's WorkerBase sets it)
    _harnessrl_version: int = 0
    _harnessrl_group: Any = None

    def harnessrl_weight_sync_info(self) -> dict[str, Any]:
        return {
            "extension": EXTENSION,
            "protocol": PROTOCOL,
            "policy_version": self._harnessrl_version,
            "receives": list(RECEIVES),
        }

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
        from harnessrl.engine.broadcast import WeightGroup

        init = BroadcastInit.from_json(request)
        rank = self.rank + init.rank_offset
        if self._harnessrl_group is not None:
            self._harnessrl_group.close()
            self._harnessrl_group = None
        self._harnessrl_group = WeightGroup(
            init.master_address, init.master_port, rank, init.world_size, init.backend, self.device
        )
        return {"rank": rank, "world_size": init.world_size}

    def harnessrl_receive_weights(self, request: str) -> dict[str, Any]:
        from harnessrl.engine.broadcast import receive_weights

        req = ReceiveRequest.from_json(request)
        group = self._harnessrl_group
        if group is None:
            raise RuntimeError(f"{RECEIVE}: no broadcast group; call {INIT_BROADCAST} first")
        model = self.model_runner.model
        count, loaded = load_into(model, receive_weights(group, str(req.version)))
        check_loaded(model, loaded, "broadcast")
        self._harnessrl_synchronize()
        self._harnessrl_version = req.version
        return {"policy_version": req.version, "tensors": count}

    def harnessrl_close_broadcast(self) -> dict[str, Any]:
        if self._harnessrl_group is not None:
            self._harnessrl_group.close()
        self._harnessrl_group = None
        return {"closed": True}

    def _harnessrl_synchronize(self) -> None:
        import torch

        device = getattr(self, "device", None)
        if device is not None and getattr(device, "type", "cpu") == "cuda":
            torch.cuda.synchronize(device)


async def sync_in_process(llm: Any, checkpoint_dir: str, version: int) -> list[dict[str, Any]]:
    """The same update on an engine held in process or in a Ray actor (`vllm.LLM`: plain methods; `AsyncLLM`:
    coroutines): load on every worker, then reset the prefix cache. Returns the workers' answers."""

    async def call(result: Any) -> Any:
        return await result if inspect.isawaitable(result) else result

    answers = await call(llm.collective_rpc(LOAD, args=(LoadRequest(checkpoint_dir, version).to_json(),)))
    await call(llm.reset_prefix_cache())
    return list(answers)
