"""The vLLM token-level `/v1/completions` wire format, shared by our server and our client.

Source of the format: vLLM `vllm/entrypoints/openai/protocol.py` (CompletionRequest, CompletionResponse,
CompletionResponseChoice, CompletionLogProbs, UsageInfo) and `serving_completion.py`
(`request_output_to_completion_response`), v0.10.2 and later. With `"return_token_ids": true` each choice
carries `token_ids` (sampled ids, stop token included) and `prompt_token_ids`; with `"logprobs": k` it
carries `logprobs.token_logprobs` (one float per sampled token, clamped at -9999.0) and `logprobs.tokens`.
Before v0.10.2 the reply has no `token_ids`; such servers are rejected with a clear error.

Streaming (`"stream": true`, vLLM `completion_stream_generator`): Server-Sent Events, each `data: {...}` a
CompletionStreamResponse (`object: "text_completion"`) whose `choices[0]` holds that step's `text`,
`token_ids` (with `return_token_ids`; `prompt_token_ids` only in the first chunk), `logprobs` (with
`logprobs`) and `finish_reason` (null until the last chunk); then `data: [DONE]`.

harnessrl extension (ignored by vLLM clients): our server adds `policy_version` and `token_policy_versions`
and `timings` to each choice and may answer `finish_reason: "abort"` with the tokens sampled so far (vLLM answers an
aborted request with an error instead).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from harnessrl.engine.base import EngineError, FinishReason, Generation, GenerationDelta, SamplingParams

MIN_VLLM_VERSION = "0.10.2"


def build_request(
    prompt_ids: list[int],
    sampling: SamplingParams,
    max_tokens: int,
    stop_token_ids: list[int] | None,
    model: str,
    top_logprobs: int = 0,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": int(max_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "logprobs": int(top_logprobs),  # 0: only the sampled token's logprob
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream": False,
    }
    if top_logprobs:
        body["return_tokens_as_token_ids"] = True  # vLLM keys top_logprobs "token_id:N" (text is ambiguous)
    if sampling.seed is not None:
        body["seed"] = int(sampling.seed)
    if stop_token_ids:
        body["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return body


def _first_choice(
    body: Any, bad, *, streamed: bool
) -> tuple[dict, list[int], list[float], FinishReason | None]:
    """Checks choices[0] of a reply or stream chunk: (choice, token ids, their logprobs, finish_reason).

    A streamed chunk may carry no tokens and no finish reason yet; a whole reply must finish."""
    if not isinstance(body, dict):
        raise bad(f"expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("no choices[0]")
    choice = choices[0]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        raise bad(
            f"choices[0].token_ids is missing: the server must support `return_token_ids` "
            f"(vLLM >= {MIN_VLLM_VERSION})"
        )
    if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise bad("choices[0].token_ids is not a list of integers")
    logprobs_obj = choice.get("logprobs")
    logprobs = logprobs_obj.get("token_logprobs") if isinstance(logprobs_obj, dict) else None
    if (token_ids or not streamed) and not isinstance(logprobs, list):
        raise bad("choices[0].logprobs.token_logprobs is missing (the request asks for logprobs)")
    logprobs = logprobs or []
    if len(logprobs) != len(token_ids):
        raise bad(f"{len(token_ids)} token_ids but {len(logprobs)} token_logprobs")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs):
        raise bad("choices[0].logprobs.token_logprobs holds a non-number")
    finish = choice.get("finish_reason")
    if finish is None and streamed:
        return choice, list(token_ids), [float(x) for x in logprobs], None
    if finish not in set(FinishReason):
        raise bad(f"unknown finish_reason {finish!r}; expected one of {', '.join(FinishReason)}")
    return choice, list(token_ids), [float(x) for x in logprobs], FinishReason(finish)


def _token_versions(choice: dict, n_tokens: int, default_version: int) -> tuple[int, list[int]]:
    version = int(choice.get("policy_version", default_version))
    versions = choice.get("token_policy_versions") or [version] * n_tokens
    return version, [int(v) for v in versions]


def parse_stream_chunk(body: Any, source: str, default_version: int = 0) -> GenerationDelta:
    """Reads one streamed CompletionStreamResponse chunk into a GenerationDelta, or raises EngineError."""

    def bad(what: str) -> EngineError:
        return EngineError(f"{source}: malformed /v1/completions stream chunk: {what}")

    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        raise EngineError(f"{source}: engine failed mid-stream: {body['error'].get('message')}")
    choice, token_ids, logprobs, finish = _first_choice(body, bad, streamed=True)
    _, versions = _token_versions(choice, len(token_ids), default_version)
    return GenerationDelta(token_ids, logprobs, versions, finish)


def build_stream_chunk(
    delta: GenerationDelta,
    text: str,
    chunk_id: str,
    created: int,
    model: str,
    request: dict[str, Any],
    prompt_ids: list[int] | None,
    policy_version: int,
) -> dict[str, Any]:
    """One vLLM-shaped CompletionStreamResponse; `prompt_ids` only for the first chunk."""
    logprobs = None
    if request.get("logprobs") is not None:
        logprobs = {
            "text_offset": [],
            "token_logprobs": [max(lp, -9999.0) for lp in delta.logprobs],
            "tokens": [f"token_id:{t}" for t in delta.token_ids],
            "top_logprobs": None,
        }
    return_ids = bool(request.get("return_token_ids"))
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
        "stop_reason": None,
        "token_ids": delta.token_ids if return_ids else None,
        "prompt_token_ids": prompt_ids if return_ids and prompt_ids is not None else None,
        "policy_version": delta.token_policy_versions[-1] if delta.token_policy_versions else policy_version,
        "token_policy_versions": delta.token_policy_versions,
    }
    return {
        "id": chunk_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": None,
    }


def parse_response(body: Any, source: str, default_version: int = 0, top_k: int = 0) -> Generation:
    """Reads the first choice of a completions reply into a Generation, or raises EngineError saying what
    is wrong with the reply. `top_k`: the alternatives asked for per token (0: none)."""

    def bad(what: str) -> EngineError:
        return EngineError(f"{source}: malformed /v1/completions reply: {what}")

    choice, token_ids, logprobs, finish = _first_choice(body, bad, streamed=False)
    if finish is None:
        raise bad("choices[0].finish_reason is missing")
    version, versions = _token_versions(choice, len(token_ids), default_version)
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=finish,
        policy_version=version,
        token_policy_versions=versions,
        top_logprobs=_top_logprobs(choice, len(token_ids), top_k, bad),
        timings={k: float(v) for k, v in (choice.get("timings") or {}).items() if isinstance(v, int | float)},
        cached_prompt_tokens=cached_prompt_tokens(body.get("usage")),
    )


def _top_logprobs(choice: dict, n_tokens: int, top_k: int, bad) -> list[list[tuple[int, float]]] | None:
    """Per token, the best alternatives (id, logprob), best first: our server's `top_logprob_ids`, or vLLM's
    `logprobs.top_logprobs` dicts keyed "token_id:N" (`return_tokens_as_token_ids`; vLLM also lists the
    sampled token when it is not among the best, so each row is cut to `top_k`)."""
    ours = choice.get("top_logprob_ids")
    if isinstance(ours, list):
        return [[(int(i), float(lp)) for i, lp in row] for row in ours]
    if top_k <= 0:
        return None  # vLLM answers `logprobs: 0` with the sampled token alone, keyed by its text
    raw = choice["logprobs"].get("top_logprobs")
    if not (isinstance(raw, list) and raw and all(isinstance(row, dict) for row in raw)):
        return None
    if len(raw) != n_tokens:
        raise bad(f"{n_tokens} token_ids but {len(raw)} rows of top_logprobs")
    rows: list[list[tuple[int, float]]] = []
    for row in raw:
        parsed = []
        for key, lp in row.items():
            if not (isinstance(key, str) and key.startswith("token_id:")) or isinstance(lp, bool):
                raise bad(f"top_logprobs key {key!r} is not a token id (send return_tokens_as_token_ids)")
            parsed.append((int(key.removeprefix("token_id:")), float(lp)))
        rows.append(sorted(parsed, key=lambda p: -p[1]))
    return [r[:top_k] for r in rows]


def cached_prompt_tokens(usage: Any) -> int:
    """`usage.prompt_tokens_details.cached_tokens` (vLLM: with --enable-prompt-tokens-details), else 0."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else 0


def build_response(
    generation: Generation,
    prompt_ids: list[int],
    model: str,
    tokenizer,
    request: dict[str, Any],
    stop_token_ids: list[int] | None,
) -> dict[str, Any]:
    """A vLLM-shaped CompletionResponse for one generation."""
    skip_special = bool(request.get("skip_special_tokens", True))
    tokens = [tokenizer.decode([t]) for t in generation.token_ids]
    logprobs = None
    if request.get("logprobs") is not None:
        offsets, pos = [], 0
        for text in tokens:
            offsets.append(pos)
            pos += len(text)
        top = None
        if generation.top_logprobs is not None:
            top = [
                {tokenizer.decode([i]): max(lp, -9999.0) for i, lp in row} for row in generation.top_logprobs
            ]
        else:
            top = [{text: max(lp, -9999.0)} for text, lp in zip(tokens, generation.logprobs, strict=True)]
        logprobs = {
            "text_offset": offsets,
            "token_logprobs": [max(lp, -9999.0) for lp in generation.logprobs],
            "tokens": tokens,
            "top_logprobs": top,
        }
    last = generation.token_ids[-1] if generation.token_ids else None
    stop_reason = (
        last if generation.finish_reason == FinishReason.STOP and last in set(stop_token_ids or ()) else None
    )
    choice: dict[str, Any] = {
        "index": 0,
        "text": tokenizer.decode(generation.token_ids, skip_special_tokens=skip_special),
        "logprobs": logprobs,
        "finish_reason": generation.finish_reason,
        "stop_reason": stop_reason,
        "token_ids": generation.token_ids if request.get("return_token_ids") else None,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if request.get("return_token_ids") else None,
        "policy_version": generation.policy_version,
        "token_policy_versions": generation.token_policy_versions,
        "timings": generation.timings,
    }
    if generation.top_logprobs is not None:
        choice["top_logprob_ids"] = [[[i, lp] for i, lp in row] for row in generation.top_logprobs]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + len(generation.token_ids),
            "completion_tokens": len(generation.token_ids),
            # vLLM's field (with --enable-prompt-tokens-details): prompt tokens served from the prefix cache
            "prompt_tokens_details": {"cached_tokens": generation.cached_prompt_tokens},
        },
        "kv_transfer_params": None,
    }


def error_body(message: str, code: int, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM's ErrorResponse shape (v0.11+ nests it under "error")."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
