"""Inference engines behind one token-level interface (see docs/engine.md).

Importing this package is cheap and never imports torch or vllm: the implementations load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnessrl.engine.base import (
    Engine,
    EngineError,
    EngineRequestError,
    Generation,
    SamplingParams,
)

if TYPE_CHECKING:
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.engine.local import LocalEngine
    from harnessrl.engine.router import Router

_LAZY = {
    "LocalEngine": "harnessrl.engine.local",
    "HTTPEngine": "harnessrl.engine.http_client",
    "Router": "harnessrl.engine.router",
}

__all__ = [
    "Engine",
    "EngineError",
    "EngineRequestError",
    "Generation",
    "HTTPEngine",
    "LocalEngine",
    "Router",
    "SamplingParams",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
