"""`harnessrl gateway serve | export | admin …`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from enum import StrEnum

from harnessrl.cli import UserError

from .enums import EndStatus, PauseMode, Selection
from .toolcalls import PARSERS


class AdminAction(StrEnum):
    CREATE_SESSION = "create-session"
    END_SESSION = "end-session"
    SESSION = "session"
    PAUSE = "pause"
    RESUME = "resume"
    METRICS = "metrics"


def register(commands, stages) -> None:
    gw = commands.add_parser(
        "gateway", help="token-exact recording gateway (OpenAI/Anthropic APIs -> engine)"
    )
    sub = gw.add_subparsers(dest="gateway_command", metavar="SUBCOMMAND")

    serve = sub.add_parser("serve", help="run the gateway (prints 'READY <base_url>' when listening)")
    engine = serve.add_mutually_exclusive_group(required=True)
    engine.add_argument(
        "--engine-url", help="vLLM-compatible token API base URL (vLLM or `harnessrl engine serve`)"
    )
    engine.add_argument(
        "--local-engine", action="store_true", help="run the local transformers engine in-process"
    )
    serve.add_argument("--model-dir", help="model/tokenizer directory (default: the tiny SmolLM2 model)")
    serve.add_argument(
        "--hf-tokenizer",
        action="store_true",
        help="use the transformers tokenizer (default: the light tokenizers+jinja2 one, same ids)",
    )
    serve.add_argument("--journal", required=True, help="journal directory (recovered on start)")
    serve.add_argument(
        "--admin-token",
        default=os.environ.get("HARNESSRL_GATEWAY_ADMIN_TOKEN"),
        help="admin bearer token (or env HARNESSRL_GATEWAY_ADMIN_TOKEN)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--max-model-len", type=int, default=32768)
    serve.add_argument("--tool-format", default="hermes", choices=sorted(PARSERS))
    serve.add_argument("--drift-check-every", type=int, default=10)
    serve.add_argument(
        "--stream-interval-ms",
        type=int,
        default=1000,
        help="a streamed reply's text at most this often (0: each step)",
    )
    serve.add_argument("--rollback-any-depth", action="store_true")
    serve.add_argument(
        "--max-request-mb",
        type=float,
        default=8.0,
        help="larger request bodies are refused with 413 (default 8)",
    )
    serve.add_argument(
        "--salvage",
        action="store_true",
        help="start even if the journal has corrupt lines: keep every complete record, report and set aside "
        "the rest (the original journal is kept beside it)",
    )
    serve.set_defaults(func=_serve)

    exp = sub.add_parser("export", help="journal -> records.parquet + samples.parquet (offline)")
    exp.add_argument("--journal", required=True)
    exp.add_argument("--out", required=True)
    exp.add_argument("--rollout-id")
    exp.add_argument("--session-id")
    exp.add_argument("--selection", type=Selection, default=Selection.ALL, choices=list(Selection))
    exp.add_argument(
        "--salvage",
        action="store_true",
        help="keep every complete record of a journal with corrupt lines; the result lists what was dropped",
    )
    exp.set_defaults(func=_export)

    adm = sub.add_parser("admin", help="admin calls against a running gateway")
    adm.add_argument("action", type=AdminAction, choices=list(AdminAction))
    adm.add_argument("--url", required=True)
    adm.add_argument("--admin-token", default=os.environ.get("HARNESSRL_GATEWAY_ADMIN_TOKEN"))
    adm.add_argument("--rollout-id")
    adm.add_argument("--group-id")
    adm.add_argument("--session-id")
    adm.add_argument("--mode", type=PauseMode, default=PauseMode.FINISH, choices=list(PauseMode))
    adm.add_argument(
        "--hold-new", action="store_true", help="pause: new calls wait until resume instead of getting 429"
    )
    adm.add_argument("--status", type=EndStatus, default=EndStatus.OK, choices=list(EndStatus))
    adm.set_defaults(func=_admin)


def _serve(args: argparse.Namespace) -> int:
    if not args.admin_token:
        raise UserError("--admin-token (or HARNESSRL_GATEWAY_ADMIN_TOKEN) is required")
    from .config import GatewayConfig
    from .server import GatewayServer

    if args.local_engine:
        from harnessrl.engine.local import LocalEngine

        engine = LocalEngine(args.model_dir)
        tokenizer = engine.tokenizer
    else:
        engine = _http_engine(args.engine_url)
        if args.hf_tokenizer:
            from harnessrl.tinymodel import load_tokenizer

            tokenizer = load_tokenizer(args.model_dir)
        else:
            from harnessrl.light_tokenizer import load_gateway_tokenizer

            tokenizer = load_gateway_tokenizer(args.model_dir)
    if not args.max_request_mb > 0:
        raise UserError(f"--max-request-mb must be > 0, got {args.max_request_mb}")
    config = GatewayConfig(
        max_model_len=args.max_model_len,
        tool_format=args.tool_format,
        drift_check_every=args.drift_check_every,
        rollback_any_depth=args.rollback_any_depth,
        max_request_bytes=int(args.max_request_mb * (1 << 20)),
        stream_interval_ms=args.stream_interval_ms,
        salvage=args.salvage,
    )
    server = GatewayServer(engine, tokenizer, args.journal, args.admin_token, args.host, args.port, config)

    async def run() -> None:
        url = await server.start_async()
        # The gateway process allocates many short-lived objects per call (JSON bodies, token lists) while its
        # long-lived state (sessions, chains) only grows: collect the young generation less often, and keep
        # what startup and journal recovery built out of every future collection.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)
        print(f"READY {url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop_async()

    try:  # libuv's event loop: ~10% less CPU per call than asyncio's on this workload (benchmarks/gateway.py)
        import uvloop
    except ImportError:
        asyncio.run(run())
    else:
        uvloop.run(run())
    return 0


def _http_engine(url: str):
    from harnessrl.engine.http_client import HTTPEngine

    return HTTPEngine(url)


def _export(args: argparse.Namespace) -> int:
    from .export import export_journal

    result = export_journal(
        args.journal, args.out, args.selection, args.session_id, args.rollout_id, args.salvage
    )
    print(json.dumps(result))
    return 0


def _admin(args: argparse.Namespace) -> int:
    from .client import GatewayAdmin, GatewayClientError

    if not args.admin_token:
        raise UserError("--admin-token (or HARNESSRL_GATEWAY_ADMIN_TOKEN) is required")
    admin = GatewayAdmin(args.url, args.admin_token)
    need = {
        AdminAction.CREATE_SESSION: ("rollout_id", "group_id"),
        AdminAction.END_SESSION: ("session_id",),
        AdminAction.SESSION: ("session_id",),
    }
    for k in need.get(args.action, ()):
        if not getattr(args, k):
            raise UserError(f"admin {args.action} needs --{k.replace('_', '-')}")
    try:
        if args.action is AdminAction.CREATE_SESSION:
            out = admin.create_session(args.rollout_id, args.group_id).__dict__
        elif args.action is AdminAction.END_SESSION:
            out = admin.end_session(args.session_id, args.status)
        elif args.action is AdminAction.SESSION:
            out = admin.session(args.session_id)
        elif args.action is AdminAction.PAUSE:
            out = admin.pause(args.mode, hold_new=args.hold_new)
        elif args.action is AdminAction.RESUME:
            out = admin.resume()
        else:
            out = admin.metrics()
    except GatewayClientError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"cannot reach the gateway at {args.url}: {e}") from None
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0
