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

from enum import StrEnum

from harnessrl.engine.base import Engine, WeightLoadingEngine, WeightSyncMode, WeightSyncUnsupported

EXTENSION_CLS = "harnessrl.engine.vllm_worker.WeightSyncExtension"
VLLM_VERSION = (
    "0.32"  # the vLLM whose endpoints and worker API the protocol was written against (the [gpu] extra)
)
VLLM_FIX = (
    f"start vLLM with --worker-extension-cls {EXTENSION_CLS} and VLLM_SERVER_DEV_MODE=1 "
    "(docs/engine.md, 'Weight sync')"
)

__all__ = ["WeightSyncUnsupported", "ensure_weight_sync"]


class WeightSyncProtocol(StrEnum):
    """How an HTTP engine takes new weights."""

    HARNESSRL = "harnessrl"  # `harnessrl engine serve`: POST /load_weights
    VLLM = "vllm"  # vLLM + WeightSyncExtension: /pause, /collective_rpc, /reset_prefix_cache, /resume


async def ensure_weight_sync(
    engine: Engine, name: str, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT
) -> None:
    """Raises WeightSyncUnsupported (one line: `name`, the engine, the fix) unless `engine` can take weights
    the way `mode` sends them."""
    try:
        if not isinstance(engine, WeightLoadingEngine):
            raise WeightSyncUnsupported(
                f"{engine!r} cannot take new weights (it is no WeightLoadingEngine); use LocalEngine, "
                "HTTPEngine (harnessrl engine serve, or vLLM with the worker extension) or a Router of them"
            )
        await engine.check_weight_sync(WeightSyncMode(mode))
    except WeightSyncUnsupported as e:
        raise WeightSyncUnsupported(f"{name}: {e}") from e
