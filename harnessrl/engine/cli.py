"""`harnessrl engine ...` commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from harnessrl.engine.base import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_PREFIX_CACHE_MB,
    DEFAULT_SPECULATIVE_TOKENS,
    DEFAULT_STEP_TOKENS,
    DType,
    ModelImpl,
)


def register(commands, stages) -> None:  # the engine is a service, not a pipeline stage: `stages` unused
    engine = commands.add_parser("engine", help="inference engine: serve the local engine over HTTP")
    sub = engine.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")
    serve = sub.add_parser("serve", help="serve a model with a vLLM-compatible token API (/v1/completions)")
    serve.add_argument(
        "--model",
        default=None,
        help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    serve.add_argument("--served-model-name", default=None, help="name in /v1/models (default: dir name)")
    serve.add_argument("--max-batch", type=int, default=32, help="most requests decoded together")
    serve.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: adaptive, all cores while other processes leave them idle, 1 "
        "while they do not; 0 = torch's default)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=DEFAULT_PREFIX_CACHE_MB,
        help=f"memory budget of the prefix cache in MiB (default {DEFAULT_PREFIX_CACHE_MB}; 0 turns it off)",
    )
    serve.add_argument(
        "--step-tokens",
        type=int,
        default=DEFAULT_STEP_TOKENS,
        help=f"tokens per scheduler step: one per decoding request plus prefill chunks ({DEFAULT_STEP_TOKENS})",
    )
    serve.add_argument(
        "--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS, help="prefix cache block size"
    )
    serve.add_argument(
        "--speculative-tokens",
        type=int,
        default=DEFAULT_SPECULATIVE_TOKENS,
        help=f"prompt-lookup drafts per decoding request and step ({DEFAULT_SPECULATIVE_TOKENS}; 0 turns it off)",
    )
    serve.add_argument("--dtype", type=DType, default=DType.FLOAT32, choices=list(DType))
    serve.add_argument(
        "--model-impl",
        type=ModelImpl,
        default=ModelImpl.AUTO,
        choices=list(ModelImpl),
        help="native: the engine's own forward pass for llama/mistral/qwen2 checkpoints (no transformers "
        "import); transformers: transformers' model; auto (default): native where it serves the checkpoint",
    )
    serve.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    serve.add_argument("--policy-version", type=int, default=0, help="weight version of the initial model")
    serve.set_defaults(func=_serve)
    engine.set_defaults(func=lambda args: engine.print_help() or 2)


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harnessrl.cli import UserError

    if args.model and not (Path(args.model) / "config.json").is_file():
        raise UserError(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    from harnessrl.engine.base import EngineError
    from harnessrl.engine.local import LocalEngine
    from harnessrl.engine.server import serve

    try:
        engine = LocalEngine(
            args.model,
            max_batch=args.max_batch,
            dtype=args.dtype,
            device=args.device,
            threads=args.threads,
            policy_version=args.policy_version,
            prefix_cache_mb=args.prefix_cache_mb,
            step_tokens=args.step_tokens,
            block_tokens=args.block_tokens,
            speculative_tokens=args.speculative_tokens,
            model_impl=args.model_impl,
        )
    except EngineError as e:
        raise UserError(str(e)) from e

    async def serve_and_announce() -> None:
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(serve(engine, args.host, args.port, args.served_model_name, ready=ready))
        await asyncio.wait({server, ready}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            print(f"harnessrl engine listening on {ready.result()}", flush=True)
        await server

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_and_announce())
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    finally:
        engine.close()
    return 0
