"""Request fields -> typed values, or a RequestError (HTTP 400) naming the field and what it must be."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from harnessrl.choices import parse_choice
from harnessrl.engine.base import SamplingParams

from .config import GatewayConfig
from .messages import RequestError

E = TypeVar("E", bound=StrEnum)


@dataclass
class CallParams:
    """A harness request's generation settings, validated."""

    max_tokens: int
    sampling: SamplingParams
    stops: list[str]
    stream: bool = False
    include_usage: bool = False  # OpenAI stream_options.include_usage


def choice(enum: type[E], value: object, name: str) -> E:
    try:
        return parse_choice(enum, value, name)
    except ValueError as e:
        raise RequestError(str(e)) from None


def integer(value: object, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RequestError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


def number(value: object, name: str, minimum: float = 0.0) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise RequestError(f"{name}: must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def flag(value: object, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name}: must be true or false, got {value!r}")
    return value


def optional_str(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{name}: must be a string or null, got {value!r}")
    return value


def _stops(value: object, name: str) -> list[str]:
    stops = [value] if isinstance(value, str) else value or []
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise RequestError(f"{name}: expected a string or a list of strings")
    return stops


def _sampling(body: dict[str, Any]) -> SamplingParams:
    def given(key: str, default: Any) -> Any:
        value = body.get(key)
        return default if value is None else value

    try:
        return SamplingParams(given("temperature", 1.0), given("top_p", 1.0), body.get("seed"))
    except ValueError as e:  # names the field
        raise RequestError(str(e)) from None


def openai_params(body: dict[str, Any], config: GatewayConfig) -> CallParams:
    if body.get("n") not in (None, 1):
        raise RequestError("n: only n=1 is supported (send several requests for several samples)")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    raw = body.get(name)
    max_tokens = config.default_max_tokens if raw is None else integer(raw, name, 1)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options: must be an object, got {options!r}")
    return CallParams(
        max_tokens,
        _sampling(body),
        _stops(body.get("stop"), "stop"),
        flag(body.get("stream"), "stream"),
        flag((options or {}).get("include_usage"), "stream_options.include_usage"),
    )


def anthropic_params(body: dict[str, Any]) -> CallParams:
    if body.get("max_tokens") is None:
        raise RequestError("max_tokens: required integer >= 1 (Anthropic Messages API)")
    return CallParams(
        integer(body["max_tokens"], "max_tokens", 1),
        _sampling(body),
        _stops(body.get("stop_sequences"), "stop_sequences"),
        flag(body.get("stream"), "stream"),
    )


def responses_params(body: dict[str, Any], config: GatewayConfig) -> CallParams:
    """OpenAI Responses: `max_output_tokens` (absent: the gateway's default), sampling, `stream`; the API has no
    stop strings."""
    raw = body.get("max_output_tokens")
    max_tokens = config.default_max_tokens if raw is None else integer(raw, "max_output_tokens", 1)
    return CallParams(max_tokens, _sampling(body), [], flag(body.get("stream"), "stream"))
