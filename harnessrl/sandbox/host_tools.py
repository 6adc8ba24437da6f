"""An environment's host tools as commands inside the sandbox, for agents that bring their own tool loop.

The search environment's `search` and `read` are lookups in a read-only index on the host
(environments.base.HostTools); the react harness calls them as its own tools. Claude Code, Codex and
mini-swe-agent run commands instead: for them the rollout serves the same tools on a Unix socket of its own
(`HostToolSocket`) and binds a directory read-only into the sandbox at TOOLS_MOUNT holding that socket and one
executable per tool (`/run/harnessrl/tools/search <query>`, `/run/harnessrl/tools/read <doc_id>`): a
standard-library client (host_tool_client.py) that sends its arguments and prints the answer — exactly what
react's tool returns. The socket answers those tools on this task's data and nothing else; the sandbox keeps
no network. A Kubernetes pod is remote, so no host socket reaches it (rollout.fit refuses that pairing).

Protocol: one JSON line `{"tool": name, "argv": [...]}` in, the tool's text out, then the connection closes.
The words of `argv` fill the tool's first required parameter (a query, a document id).
"""

from __future__ import annotations

import json
import logging
import shutil
import socketserver
import threading
from pathlib import Path

from harnessrl.harness.runtime import ToolRuntime
from harnessrl.harness.tools import MalformedArguments, Tool, parse_arguments

logger = logging.getLogger(__name__)

TOOLS_MOUNT = "/run/harnessrl/tools"
SOCKET_NAME = "host.sock"
CLIENT = Path(__file__).with_name("host_tool_client.py")
REQUEST_BYTES = 64 * 1024
TOOL_TIMEOUT_S = 30.0


class HostToolSocket:
    """Serves `tools` (their runtime: `runtime`) on a Unix socket in a temp dir of its own, beside one client
    executable per tool; `close()` stops it and removes the dir."""

    def __init__(self, runtime: ToolRuntime, tools: dict[str, Tool]) -> None:
        from harnessrl.sandbox.leftovers import make_tempdir

        self.tools = tools
        self.dir = make_tempdir("tools")
        self.dir.chmod(0o755)
        for name in tools:
            shutil.copyfile(CLIENT, self.dir / name)
            (self.dir / name).chmod(0o755)
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(REQUEST_BYTES)
                self.wfile.write(owner.answer(line, runtime).encode())

        self._server = socketserver.ThreadingUnixStreamServer(str(self.dir / SOCKET_NAME), Handler)
        self._server.daemon_threads = True
        (self.dir / SOCKET_NAME).chmod(0o666)  # the sandbox's uid connects; it answers lookups only
        self._thread = threading.Thread(target=self._server.serve_forever, name="host-tools", daemon=True)
        self._thread.start()

    def answer(self, line: bytes, runtime: ToolRuntime) -> str:
        try:
            request = json.loads(line)
            tool = self.tools[request["tool"]]
            words = [str(w) for w in request["argv"]]
            required = tool.parameters.get("required", [])
            args = parse_arguments(tool, {required[0]: " ".join(words)} if required and words else {})
            return tool.execute(args, runtime, TOOL_TIMEOUT_S).content
        except (ValueError, KeyError, TypeError, MalformedArguments) as e:
            return f"Error: {type(e).__name__}: {e}"
        except Exception as e:  # the lookup broke: the agent sees it, the log keeps it
            logger.warning("host tool request %r failed: %s", line[:200], e)
            return f"Error: the tool failed: {e}"

    def usage(self) -> str:
        """What the agent is told: each command and what it does."""
        lines = []
        for name, tool in self.tools.items():
            required = tool.parameters.get("required", [])
            arg = f" <{required[0]}>" if required else ""
            lines.append(f"- `{TOOLS_MOUNT}/{name}{arg}`: {tool.description}")
        return "Commands for this task, to run in your shell:\n" + "\n".join(lines)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)
