"""New weights into a running vLLM, through vLLM's documented RL hook: a worker extension.

Start vLLM with `--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension`: vLLM mixes the class
into its worker class, so in each method `self` is the worker (vLLM 0.32's `Worker`: `model_runner`,
`model_config`, `vllm_config`, `device`, `rank`, `reload_weights`). The methods are reached with
`collective_rpc(method, args=(request_json,))`, which runs them on every worker (tensor-parallel rank) and returns
one answer per worker:
- over HTTP: `POST /collective_rpc {"method": ..., "args": ["<json>"]}` (dev endpoints: VLLM_SERVER_DEV_MODE=1;
  vLLM passes only string arguments over HTTP, hence one JSON string) — `HTTPEngine.load_weights` does this;
- in process or in a Ray actor holding `LLM` / `AsyncLLM`: the same call on the engine (`sync_in_process`).

Two ways in: `harnessrl_load_weights` reads a checkpoint directory of safetensors (a local path, or `s3://`
fetched with harnessrl.store: every replica pulls what the trainer wrote), and the broadcast path
(`harnessrl_init_broadcast` once: joins a process group with the trainer as rank 0, nccl on GPUs or gloo,
`harnessrl.engine.broadcast.WeightGroup`; then `harnessrl_receive_weights` per sync: the worker receives the
buckets the trainer broadcasts, each announced by a header of names, dtypes and shapes). A LoRA run's adapter
comes either way alone: `harnessrl_load_adapter` reads a PEFT directory, a broadcast whose request names the
adapter's rank and alpha carries its tensors; the worker merges it onto the served checkpoint's own weights. The
caller pauses generation around the update and resets the prefix cache after it (engine-level, not worker,
operations).

An update is all or nothing from the sampler's view:
1. the whole update is in hand before any parameter changes: a checkpoint's safetensors headers are read (which
   checks that each file holds every byte its header announces), a broadcast is received to its end marker
   (held in host memory);
2. it is checked against the served checkpoint's tensors: the same names (every one, none unknown), shapes, and
   dtype kinds (a float may arrive in another float width: vLLM casts), and refused (`UpdateRejected`: nothing
   changed, the engine still serves its version) unless it matches;
3. only then is it loaded. Should loading fail after all, the error says so and the workers report
   `"failed_update"` in `harnessrl_weight_sync_info` until a complete update succeeds (the client keeps such an
   engine paused).
A receiver never leaves the trainer blocked in a broadcast: it receives to the end marker before it checks
anything, and when the stream itself breaks off it closes its group, which fails the trainer's pending
broadcast at once instead of after the group's timeout (600 s).

Loading goes through vLLM's in-place reload (`Worker.reload_weights(weights_iterator=...)`: the layerwise
reload of `vllm.model_executor.model_loader.reload`, what vLLM's own weight-transfer engines use), not
`model.load_weights` on the live parameters: after loading, vLLM turns weights into kernel formats
(`process_weights_after_loading`; on a CPU every linear weight is packed for oneDNN and its parameter replaced by
an empty one with no `weight_loader`), so each layer is put back in checkpoint form, loaded, processed again and
copied into the tensors the kernels hold. A module tied to another one (the lm_head sharing the embedding, which
on a CPU keeps its own packed copy) is processed again too, as vLLM's reload does not (its limitation 2).
vllm, torch and CUDA are imported inside functions only: this module imports anywhere and never imports vllm.
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from harnessrl.train.lora import Adapter

logger = logging.getLogger(__name__)

PROTOCOL = (
    3  # bumped when a method's arguments or answer change (2: broadcast with in-band headers; 3: adapters)
)
INFO = "harnessrl_weight_sync_info"
LOAD = "harnessrl_load_weights"
LOAD_ADAPTER = "harnessrl_load_adapter"
INIT_BROADCAST = "harnessrl_init_broadcast"
RECEIVE = "harnessrl_receive_weights"
CLOSE_BROADCAST = "harnessrl_close_broadcast"
EXTENSION = "harnessrl.WeightSyncExtension"  # what `INFO` answers in "extension"
RECEIVES = ("checkpoint", "broadcast", "adapter")  # listed by `INFO` and our server's `GET /load_weights`
FAILED_UPDATE = "failed_update"  # in `INFO`'s answer only while a half-applied update is loaded

# safetensors' dtype codes -> torch dtype names
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})
_SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)  # buffers some checkpoints carry and vLLM's models skip
_TIED_HEAD = "lm_head.weight"  # absent from (and ignored in) the checkpoint of a model with tied embeddings
_EXAMPLES = 3  # names quoted per kind of mismatch


class WeightSyncRequestError(ValueError):
    """A collective_rpc request the extension cannot read (names the field)."""


class UpdateRejected(ValueError):
    """An update refused before any parameter changed: the engine still serves its policy version."""


class UpdateFailed(RuntimeError):
    """An update that failed after parameters started changing: the engine serves no consistent policy until a
    complete update succeeds."""


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
    lora_rank: int = 0  # > 0: the tensors are a LoRA adapter (PEFT's names), merged onto the served weights
    lora_alpha: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, request: str) -> ReceiveRequest:
        body = _fields(request, ("version",))
        rank, alpha = (_int(body, n) if n in body else 0 for n in ("lora_rank", "lora_alpha"))
        if rank < 0 or (rank > 0) != (alpha > 0):
            raise WeightSyncRequestError(
                f"lora_rank and lora_alpha must both be > 0 (an adapter) or both 0, got {rank} and {alpha}"
            )
        return cls(_int(body, "version"), rank, alpha)

    @property
    def adapter(self) -> bool:
        return self.lora_rank > 0

    def received_adapter(self, named: Iterable[tuple[str, torch.Tensor]], source: str) -> Adapter:
        from harnessrl.train.lora import Adapter, LoraSettings

        return Adapter.from_named(named, LoraSettings(self.lora_rank, self.lora_alpha), source)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch."

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


Schema = dict[str, TensorSpec]


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


def checkpoint_schema(files: Iterable[Path], *, unique: bool = True) -> Schema:
    """Names, shapes and dtypes of a checkpoint's tensors, from the safetensors headers alone (no tensor data is
    read; opening a file checks that it holds every byte its header announces). `unique`: a name in two files
    is an error (an update); else the first one counts (the served checkpoint)."""
    from safetensors import SafetensorError, safe_open

    schema: Schema = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    piece = f.get_slice(name)
                    code = str(piece.get_dtype())
                    spec = TensorSpec(
                        tuple(int(d) for d in piece.get_shape()), _SAFETENSORS_DTYPES.get(code, code)
                    )
                    if name in schema:
                        if unique:
                            raise UpdateRejected(f"{file}: tensor {name!r} is also in another file")
                        continue
                    schema[name] = spec
        except (SafetensorError, OSError) as e:
            raise UpdateRejected(f"{file}: not a readable safetensors file ({e})") from e
    return schema


def tensors_schema(named: Iterable[tuple[str, torch.Tensor]]) -> Schema:
    schema: Schema = {}
    for name, tensor in named:
        if name in schema:
            raise UpdateRejected(f"tensor {name!r} arrived twice")
        schema[name] = TensorSpec(
            tuple(int(d) for d in tensor.shape), str(tensor.dtype).removeprefix("torch.")
        )
    return schema


def _ignored(name: str, tied: bool) -> bool:
    """Names vLLM's models skip when loading, so an update may carry them or not."""
    return name.endswith(_SKIPPED_SUFFIXES) or (tied and name == _TIED_HEAD)


def _quoted(names: Sequence[str]) -> str:
    more = f" and {len(names) - _EXAMPLES} more" if len(names) > _EXAMPLES else ""
    return ", ".join(names[:_EXAMPLES]) + more


def schema_mismatches(
    update: Mapping[str, TensorSpec], reference: Mapping[str, TensorSpec], tied: bool
) -> list[str]:
    """What keeps `update` from replacing every tensor of `reference` (empty when it may): names missing and
    unknown, shapes that differ, dtypes of another kind (a float may come in another float width)."""
    problems: list[str] = []
    missing = sorted(n for n in reference if n not in update and not _ignored(n, tied))
    if missing:
        problems.append(f"{len(missing)} of the served model's tensors missing ({_quoted(missing)})")
    unknown = sorted(n for n in update if n not in reference and not _ignored(n, tied))
    if unknown:
        problems.append(f"{len(unknown)} tensors the served model does not have ({_quoted(unknown)})")
    common = [n for n in update if n in reference]
    shapes = sorted(
        f"{n} {update[n]} for {reference[n]}" for n in common if update[n].shape != reference[n].shape
    )
    if shapes:
        problems.append(f"{len(shapes)} shapes differ ({_quoted(shapes)})")
    kinds = sorted(
        f"{n} {update[n].dtype} for {reference[n].dtype}"
        for n in common
        if update[n].dtype != reference[n].dtype
        and not (update[n].dtype in _FLOAT_DTYPES and reference[n].dtype in _FLOAT_DTYPES)
    )
    if kinds:
        problems.append(f"{len(kinds)} dtypes of another kind ({_quoted(kinds)})")
    return problems


def served_checkpoint(model: str, revision: str | None = None, download_dir: str | None = None) -> Path:
    """The directory of the checkpoint vLLM was started from: `--model` itself when it is a directory, else
    the model's snapshot in the Hugging Face cache (where vLLM downloaded it)."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                model,
                revision=revision,
                cache_dir=download_dir,
                local_files_only=True,
                allow_patterns=["*.safetensors"],
            )
        )
    except Exception as e:  # huggingface_hub's errors for a name not in the cache have no common base
        raise UpdateRejected(
            f"cannot check updates against the served checkpoint: {model!r} is neither a directory nor in the "
            f"Hugging Face cache ({type(e).__name__}: {e}); start vLLM with --model <local checkpoint dir>"
        ) from e


def tied_followers(model: Any) -> list[Any]:
    """Modules whose every own parameter belongs to a module met before (a tied lm_head): vLLM's reload loads
    and processes the first owner only, so whatever such a module derived from the shared weight is stale."""
    seen: set[int] = set()
    followers = []
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and all(id(p) in seen for p in own):
            followers.append(module)
        seen.update(id(p) for p in own)
    return followers


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`--worker-extension-cls`). Every method answers a JSON-able dict. Every
    name is prefixed `harnessrl_`: vLLM refuses an extension whose attributes the worker already has."""

    # vLLM 0.32 Worker attributes and the method used here (annotations only: nothing shadows them)
    model_runner: Any  # .get_model(): the served nn.Module
    model_config: Any  # .model (checkpoint dir or name), .revision, .hf_text_config, .quantization
    vllm_config: Any  # .load_config.download_dir
    device: Any
    rank: int  # the worker's rank within its engine
    reload_weights: Any  # (weights_iterator=..., is_checkpoint_format=True): vLLM's in-place layerwise reload

    _harnessrl_version: int = 0
    _harnessrl_group: Any = None
    _harnessrl_reference: Schema | None = None
    _harnessrl_failed: dict[str, Any] | None = None  # {"version", "error"} of a half-applied update

    def harnessrl_weight_sync_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "extension": EXTENSION,
            "protocol": PROTOCOL,
            "policy_version": self._harnessrl_version,
            "receives": list(RECEIVES),
        }
        if self._harnessrl_failed is not None:
            info[FAILED_UPDATE] = dict(self._harnessrl_failed)
        return info

    def harnessrl_load_weights(self, request: str) -> dict[str, Any]:
        req = LoadRequest.from_json(request)
        staging = None
        try:
            directory = Path(req.path)
            if req.path.startswith(("s3://", "minio://")):
                from harnessrl.store import ObjectStore

                staging = Path(tempfile.mkdtemp(prefix="harnessrl-weights-"))
                directory = staging / "checkpoint"
                ObjectStore.from_env().download_dir(req.path, directory)
            try:
                files = checkpoint_files(directory)
            except FileNotFoundError as e:
                raise UpdateRejected(f"{e}; the engine still serves version {self._harnessrl_version}") from e
            self._harnessrl_check(checkpoint_schema(files), req.version, req.path)
            count = self._harnessrl_apply(iter_safetensors(files), req.version, req.path)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        return {"policy_version": req.version, "tensors": count}

    def harnessrl_load_adapter(self, request: str) -> dict[str, Any]:
        """A LoRA adapter directory (PEFT's layout) merged onto the served checkpoint (`_harnessrl_merge`)."""
        from harnessrl.train.lora import Adapter

        req = LoadRequest.from_json(request)
        try:
            adapter = Adapter.load(Path(req.path))
        except (ValueError, OSError) as e:
            raise UpdateRejected(f"{e}; the engine still serves version {self._harnessrl_version}") from e
        return self._harnessrl_merge(adapter, req.version, f"adapter {req.path}")

    def harnessrl_init_broadcast(self, request: str) -> dict[str, Any]:
        from harnessrl.engine.broadcast import WeightGroup

        init = BroadcastInit.from_json(request)
        rank = self.rank + init.rank_offset
        self.harnessrl_close_broadcast()
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
        source = f"broadcast update {req.version}"
        staged: list[tuple[str, torch.Tensor]] = []
        try:
            for name, tensor in receive_weights(group, str(req.version)):
                # views into each received bucket (which they keep alive); off a GPU to the host, so that a
                # whole update never needs a second copy of the weights in device memory
                staged.append((name, tensor if tensor.device.type == "cpu" else tensor.to("cpu")))
        except Exception as e:
            self.harnessrl_close_broadcast()  # the trainer's pending broadcast fails now, not at the timeout
            raise UpdateRejected(
                f"{source}: the stream broke off after {len(staged)} tensors ({type(e).__name__}: {e}); "
                f"nothing was changed (the engine still serves version {self._harnessrl_version}) and the "
                f"broadcast group is closed: join it again ({INIT_BROADCAST}; BroadcastPublisher does at its "
                "next publish)"
            ) from e
        if req.adapter:
            try:
                adapter = req.received_adapter(staged, source)
            except ValueError as e:
                raise UpdateRejected(f"{e}; the engine still serves version {self._harnessrl_version}") from e
            return self._harnessrl_merge(adapter, req.version, source)
        self._harnessrl_check(tensors_schema(staged), req.version, source)
        count = self._harnessrl_apply(staged, req.version, source)
        return {"policy_version": req.version, "tensors": count}

    def harnessrl_close_broadcast(self) -> dict[str, Any]:
        if self._harnessrl_group is not None:
            self._harnessrl_group.close()
        self._harnessrl_group = None
        return {"closed": True}

    # ---- helpers (prefixed: they become attributes of vLLM's worker) ------------------------------------

    def _harnessrl_merge(self, adapter: Adapter, version: int, source: str) -> dict[str, Any]:
        """An adapter merged onto the served checkpoint's own weights (read again from its files, so each
        version replaces the last): only the adapter travels from the trainer; vLLM reloads every weight in
        place, the adapted ones merged, as for a checkpoint update. Checked before anything changes."""
        reference = self._harnessrl_schema()
        problems = [
            f"{name}: not a weight of the served checkpoint"
            if name not in reference
            else f"{name}: {tuple(b.shape[:1] + a.shape[1:])} update for {reference[name].shape}"
            for name, (a, b) in adapter.pairs.items()
            if name not in reference or tuple(b.shape[:1] + a.shape[1:]) != tuple(reference[name].shape)
        ]
        if problems:
            raise UpdateRejected(
                f"{source}: update to version {version} refused before any weight changed: "
                f"{'; '.join(problems[:3])}; the engine still serves version {self._harnessrl_version}"
            )
        files = checkpoint_files(self._harnessrl_served_dir())

        def merged() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in iter_safetensors(files):
                yield name, adapter.merge(name, tensor) if name in adapter.pairs else tensor

        count = self._harnessrl_apply(merged(), version, source)
        return {"policy_version": version, "tensors": count, "adapted": len(adapter.pairs)}

    def _harnessrl_tied(self) -> bool:
        return bool(getattr(self.model_config.hf_text_config, "tie_word_embeddings", False))

    def _harnessrl_served_dir(self) -> Path:
        config = self.model_config
        return served_checkpoint(
            str(config.model), config.revision, self.vllm_config.load_config.download_dir
        )

    def _harnessrl_schema(self) -> Schema:
        """What an update must match: the tensors of the checkpoint vLLM serves (headers read once)."""
        if self._harnessrl_reference is None:
            directory = self._harnessrl_served_dir()
            try:
                files = checkpoint_files(directory)
            except FileNotFoundError as e:
                raise UpdateRejected(
                    f"cannot check updates against the served checkpoint ({e}); start vLLM with --model "
                    "<local checkpoint dir of safetensors>"
                ) from e
            self._harnessrl_reference = checkpoint_schema(files, unique=False)
        return self._harnessrl_reference

    def _harnessrl_check(self, update: Schema, version: int, source: str) -> None:
        problems = schema_mismatches(update, self._harnessrl_schema(), self._harnessrl_tied())
        if problems:
            raise UpdateRejected(
                f"{source}: update to version {version} refused before any weight changed: "
                f"{'; '.join(problems)}; the engine still serves version {self._harnessrl_version}: send every "
                "tensor of the served checkpoint, under its names and shapes"
            )

    def _harnessrl_apply(self, weights: Iterable[tuple[str, torch.Tensor]], version: int, source: str) -> int:
        """Loads a checked update (vLLM's in-place reload); any failure from here on leaves the engine marked
        inconsistent."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in weights:
                count += 1
                yield item

        self._harnessrl_failed = {"version": version, "error": "loading did not finish"}
        try:
            model = self.model_runner.get_model()
            followers = tied_followers(model)
            self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
            for module in followers:  # derive their kernel form again from the (shared, now new) weight
                method = getattr(module, "quant_method", None)
                if method is not None:
                    method.process_weights_after_loading(module)
            self._harnessrl_synchronize()
        except Exception as e:
            message = (
                f"{source}: update to version {version} failed after weights started changing "
                f"({type(e).__name__}: {e}); the engine serves no consistent policy until a complete update "
                "succeeds: retry it, or restart vLLM"
            )
            self._harnessrl_failed = {"version": version, "error": message}
            raise UpdateFailed(message) from e
        self._harnessrl_failed = None
        self._harnessrl_version = version
        return count

    def _harnessrl_synchronize(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


async def sync_in_process(llm: Any, checkpoint_dir: str, version: int) -> list[dict[str, Any]]:
    """The same update on an engine held in process or in a Ray actor (`vllm.LLM`: plain methods; `AsyncLLM`:
    coroutines): load on every worker, then reset the prefix cache. Returns the workers' answers."""

    async def call(result: Any) -> Any:
        return await result if inspect.isawaitable(result) else result

    answers = await call(llm.collective_rpc(LOAD, args=(LoadRequest(checkpoint_dir, version).to_json(),)))
    await call(llm.reset_prefix_cache())
    return list(answers)
