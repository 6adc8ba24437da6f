"""Can this engine take new weights? Asked once before training starts, so that a stage never trains while its
engine keeps sampling the old policy.

- `LocalEngine` (and any in-process engine with `load_weights`): yes.
- `Router`: every replica is asked; the first that cannot names itself.
- `HTTPEngine`: asks its server (`HTTPEngine.check_weight_sync`): `harnessrl engine serve` answers
  `GET /load_weights`; a vLLM server must run the worker extension (`harnessrl.engine.vllm_worker`) with its
  dev endpoints on (`/collective_rpc`).

With `mode=broadcast` the engine must also join the trainer's broadcast group: `HTTPEngine` (our server, or
vLLM with the extension) and a `Router` of them can; an in-process `LocalEngine` cannot (it shares the trainer's
process: use checkpoint mode, or serve it and pass its URL).

The answer is `WeightSyncUnsupported` with one line naming the engine and the fix.
"""

from __future__ import annotations

import asyncio
import inspect
from enum import StrEnum

from harnessrl.engine.base import EngineError, WeightLoadingEngine
from harnessrl.engine.router import Router
from harnessrl.rl.modes import WeightSyncMode

EXTENSION_CLS = "harnessrl.engine.vllm_worker.WeightSyncExtension"
VLLM_VERSION = (
    "0.32"  # the vLLM whose endpoints and worker API the protocol was written against (the [gpu] extra)
)
VLLM_FIX = (
    f"start vLLM with --worker-extension-cls {EXTENSION_CLS} and VLLM_SERVER_DEV_MODE=1 "
    "(docs/engine.md, 'Weight sync')"
)


class WeightSyncUnsupported(EngineError):
    """The engine cannot take new weights; the message is one line naming the engine and the fix."""


class WeightSyncProtocol(StrEnum):
    """How an HTTP engine takes new weights."""

    HARNESSRL = "harnessrl"  # `harnessrl engine serve`: POST /load_weights
    VLLM = "vllm"  # vLLM + WeightSyncExtension: /pause, /collective_rpc, /reset_prefix_cache, /resume


async def ensure_weight_sync(
    engine: object, name: str, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT
) -> None:
    """Raises WeightSyncUnsupported (one line: `name`, the engine, the fix) unless `engine` can take weights
    the way `mode` sends them."""
    try:
        await _probe(engine, WeightSyncMode(mode))
    except WeightSyncUnsupported as e:
        raise WeightSyncUnsupported(f"{name}: {e}") from e


async def _probe(engine: object, mode: WeightSyncMode) -> None:
    if isinstance(engine, Router):
        results = await asyncio.gather(*(_probe(e, mode) for e in engine.engines), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if not isinstance(r, WeightSyncUnsupported):
                raise r
        if failed:
            more = f" (and {len(failed) - 1} more of {len(results)} replicas)" if len(failed) > 1 else ""
            raise WeightSyncUnsupported(f"router replica {failed[0]}{more}")
        return
    check = getattr(engine, "check_weight_sync", None)
    if callable(check):
        result = check(mode)
        if inspect.isawaitable(result):
            await result
        return
    if mode is WeightSyncMode.BROADCAST:
        raise WeightSyncUnsupported(
            f"the in-process {type(engine).__name__} cannot join a weight broadcast (it shares the trainer's "
            "process); use "
            "--weight-sync checkpoint, or serve it (harnessrl engine serve, or vLLM with the worker extension) "
            "and pass --engine-url"
        )
    if not isinstance(engine, WeightLoadingEngine):
        raise WeightSyncUnsupported(
            f"{engine!r} has no load_weights(checkpoint_dir, version); use LocalEngine, HTTPEngine "
            "(harnessrl engine serve, or vLLM with the worker extension) or a Router of them"
        )
