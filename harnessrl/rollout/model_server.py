"""Serving the model for a generate run: an engine behind a recording gateway.

Locally the engine is in-process (`LocalEngine` on the tiny model or a checkpoint directory) and the gateway
listens on loopback. With `engine_url` the gateway fronts a remote engine (vLLM pool / engine server) instead;
the tokenizer then comes from `checkpoint` (or the tiny model). Harnesses only ever see the gateway.
"""

from __future__ import annotations

import inspect
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSource:
    """Which model a generate run samples from: a checkpoint served in-process, or a remote engine."""

    checkpoint: str | None = None  # HF model dir (the policy being trained); None = the tiny base model
    engine_url: str | None = None  # remote token-level engine; None = in-process LocalEngine
    max_batch: int = 16
    max_model_len: int | None = None  # prompt + completion cap at the gateway (default: the model's context)
    # in-process LocalEngine only: prefix cache budget (0: off) and torch threads (None: the engine's defaults)
    prefix_cache_mb: float | None = None
    threads: int | None = None


def _remote_engine(url: str) -> Any:
    from harnessrl.engine.http_client import HTTPEngine  # vLLM-compatible token API client

    return HTTPEngine(url)


class ModelServer:
    """Context manager: starts engine + gateway; opens/ends sessions; exports records and samples."""

    def __init__(self, source: ModelSource, journal_dir: str | Path, host: str = "127.0.0.1"):
        self.source = source
        self.host = host  # where the gateway listens and what session URLs name (Ray workers on other pods)
        self.journal_dir = Path(journal_dir)
        self.admin_token = "adm-" + secrets.token_urlsafe(16)
        self.engine: Any = None
        self.gateway: Any = None
        self.admin: Any = None

    def __enter__(self) -> ModelServer:
        from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
        from harnessrl.tinymodel import load_tokenizer, tiny_model_dir

        model_dir = Path(self.source.checkpoint) if self.source.checkpoint else tiny_model_dir()
        if self.source.engine_url:
            self.engine = _remote_engine(self.source.engine_url)
            tokenizer = load_tokenizer(model_dir)
            max_len = self.source.max_model_len or 32768
        else:
            from harnessrl.engine.local import LocalEngine

            self.engine = LocalEngine(
                model_dir,
                max_batch=self.source.max_batch,
                threads=self.source.threads,
                prefix_cache_mb=self.source.prefix_cache_mb,
            )
            tokenizer = self.engine.tokenizer
            max_len = self.source.max_model_len or self.engine.max_context
        self.gateway = GatewayServer(
            self.engine,
            tokenizer,
            self.journal_dir,
            self.admin_token,
            host=self.host,
            config=GatewayConfig(max_model_len=max_len),
        )
        base = self.gateway.start()
        self.admin = GatewayAdmin(base, self.admin_token)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        close = getattr(self.engine, "close", None)
        if close is not None and not inspect.iscoroutinefunction(
            close
        ):  # remote clients close with the gateway
            close()
