"""Serving the model for a generate run: an engine behind a recording gateway.

Locally the engine is in-process (`LocalEngine` on the tiny model or a checkpoint directory) and the gateway
listens on loopback. With `engine_url` the gateway fronts a remote engine (vLLM pool / engine server) instead;
the tokenizer then comes from `checkpoint` (or the tiny model). Harnesses only ever see the gateway.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.choices import parse_choice
from harnessrl.gateway.toolcalls import ToolParser

if TYPE_CHECKING:
    from harnessrl.engine.base import Engine
    from harnessrl.engine.local import LocalEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """Which model a generate run samples from: a checkpoint served in-process, or a remote engine."""

    # HF model dir (the policy being trained), or a LoRA adapter dir (served over its base); None = the tiny model
    checkpoint: str | None = None
    engine_url: str | None = None  # remote token-level engine; None = in-process LocalEngine
    max_batch: int = 16
    max_model_len: int | None = None  # prompt + completion cap at the gateway (default: the model's context)
    # in-process LocalEngine only: prefix cache budget (0: off) and torch threads (None: the engine's defaults)
    prefix_cache_mb: float | None = None
    threads: int | None = None
    tool_parser: ToolParser | None = (
        None  # None: read off the model's chat template (hermes if it shows none)
    )

    def __post_init__(self) -> None:  # KFP parameters and JSON configs arrive as strings
        if self.tool_parser is not None:
            object.__setattr__(self, "tool_parser", parse_choice(ToolParser, self.tool_parser, "tool_parser"))


def resolve_tool_parser(chosen: ToolParser | None, tokenizer: Any, model_dir: Path) -> ToolParser:
    """The parser asked for, else the one the chat template shows, else hermes (logged either way)."""
    from harnessrl.gateway.toolcalls import detect_tool_parser

    if chosen is not None:
        return chosen
    detected = detect_tool_parser(tokenizer)
    if detected is None:
        logger.info("%s: the chat template shows no tool-call format; parsing hermes", model_dir)
        return ToolParser.HERMES
    logger.info("%s: tool-call format %s (from the chat template)", model_dir, detected)
    return detected


class ModelServer:
    """Context manager: starts engine + gateway; opens/ends sessions; exports records and samples."""

    def __init__(self, source: ModelSource, journal_dir: str | Path, host: str = "127.0.0.1"):
        self.source = source
        self.host = host  # where the gateway listens and what session URLs name (Ray workers on other pods)
        self.journal_dir = Path(journal_dir)
        self.admin_token = "adm-" + secrets.token_urlsafe(16)
        self.engine: Engine | None = None
        self._local: LocalEngine | None = None  # the in-process engine this server started (and stops)
        self.gateway: Any = None
        self.admin: Any = None
        self.tool_parser = source.tool_parser or ToolParser.HERMES  # resolved on start

    def __enter__(self) -> ModelServer:
        from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
        from harnessrl.tinymodel import load_tokenizer, tiny_model_dir
        from harnessrl.train.lora import Adapter, adapter_base, is_adapter_dir

        model_dir = Path(self.source.checkpoint) if self.source.checkpoint else tiny_model_dir()
        adapter_dir = None
        if is_adapter_dir(model_dir):  # a LoRA adapter: its base served, the adapter merged in (version 0)
            adapter_dir, model_dir = model_dir, adapter_base(model_dir)
        if self.source.engine_url:
            from harnessrl.engine.http_client import HTTPEngine  # vLLM-compatible token API client

            self.engine = HTTPEngine(self.source.engine_url)
            tokenizer = load_tokenizer(model_dir)
            max_len = self.source.max_model_len or 32768
        else:
            from harnessrl.engine.local import LocalEngine

            self.engine = self._local = LocalEngine(
                model_dir,
                max_batch=self.source.max_batch,
                threads=self.source.threads,
                prefix_cache_mb=self.source.prefix_cache_mb,
            )
            tokenizer = self._local.tokenizer
            max_len = self.source.max_model_len or self._local.max_context
            if adapter_dir is not None:
                self._local.load_adapter_sync(Adapter.load(adapter_dir), self._local.policy_version)
        self.tool_parser = resolve_tool_parser(self.source.tool_parser, tokenizer, model_dir)
        self.gateway = GatewayServer(
            self.engine,
            tokenizer,
            self.journal_dir,
            self.admin_token,
            host=self.host,
            config=GatewayConfig(max_model_len=max_len, tool_format=self.tool_parser),
        )
        base = self.gateway.start()
        self.admin = GatewayAdmin(base, self.admin_token)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self._local is not None:  # a remote engine's client lets go of its connections with the gateway
            self._local.close()
