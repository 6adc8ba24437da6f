"""Token-exact recording gateway between agent harnesses and inference engines.

Stable API (the rollout stage builds on it):
  - In process:  `GatewayServer(engine, tokenizer, journal_dir, admin_token).start() -> base_url`
    (`.stop()`); `engine` is any `harnessrl.engine.base.Engine`. As a subprocess:
    `harnessrl gateway serve --engine-url URL --journal DIR --admin-token T` (prints `READY <base_url>`).
  - Sessions:    `POST {base}/admin/sessions {rollout_id, group_id}` -> `{session_id, api_key, base_url, ...}`;
    OpenAI base URL = `{base}/sessions/{sid}/v1`, Anthropic base URL = `{base}/sessions/{sid}`;
    end with `POST {base}/admin/sessions/{sid}/end {status: ok|failed}`.
  - Export:      `POST {base}/admin/export {out_dir, rollout_id?|session_id?, selection: all|longest}` or offline
    `harnessrl gateway export --journal DIR --out DIR` -> `records.parquet` (one row per call),
    `samples.parquet` (`harnessrl.schema.Sample` rows).
  - Python helpers: `harnessrl.gateway.client.GatewayAdmin`.
See docs/gateway.md.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import GatewayAdmin, SessionInfo
    from .config import GatewayConfig
    from .server import GatewayServer

# Lazy: `harnessrl --help` and every CLI command import this package (its cli module); the server pulls in
# aiohttp and pyarrow (~0.6 s), which only `gateway serve`/export and the rollout stage need.
_EXPORTS = {
    "GatewayAdmin": ".client",
    "SessionInfo": ".client",
    "GatewayConfig": ".config",
    "GatewayServer": ".server",
}
__all__ = ["GatewayAdmin", "GatewayConfig", "GatewayServer", "SessionInfo"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
