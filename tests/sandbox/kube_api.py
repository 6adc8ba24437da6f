"""A loopback Kubernetes API for the pod sandbox: pods (create / read / delete) as JSON over HTTP, and the exec
subresource as a real websocket speaking `v4.channel.k8s.io` (channel byte 0 stdin, 1 stdout, 2 stderr,
3 the final Status). Behind it, a stand-in kubelet: each pod is a directory, and an exec runs the command for
real in bubblewrap with that directory at /workspace (host /usr, /etc and this Python read-only), with the
pod's env; this stand-in "image" has the workspace on PYTHONPATH, as task images install their repo. What a real cluster decides on its own is scripted per test: image pull failures, pods that never
start, a container the kernel kills for memory (`oom_marker` in a command)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.loopback import ThreadedServer, loopback_kubeconfig

PY_ROOTS = sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()})


@dataclass
class Scenario:
    waiting_reason: str | None = None  # e.g. ImagePullBackOff: the container never starts
    pending_forever: bool = False
    oom_marker: str | None = None  # an exec whose command contains this dies OOMKilled with its container
    create_status: int | None = None  # answer pod creation with this error code


@dataclass
class FakePod:
    manifest: dict[str, Any]
    root: Path
    polls: int = 0
    terminated: dict[str, Any] | None = None


@dataclass
class KubeAPI:
    scenario: Scenario = field(default_factory=Scenario)
    pods: dict[str, FakePod] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    created: list[dict[str, Any]] = field(default_factory=list)
    execs: list[list[str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    base_url: str = ""

    def __post_init__(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="kube-api-"))
        self._server = ThreadedServer("kubernetes-api")

    # -- REST -----------------------------------------------------------------------------------------------
    def _record(self, request: web.Request) -> None:
        query: dict[str, list[str]] = {}
        for k, v in request.query.items():
            query.setdefault(k, []).append(v)
        self.requests.append((request.method, request.path, query))

    async def create_pod(self, request: web.Request) -> web.Response:
        self._record(request)
        body = await request.json()
        if self.scenario.create_status:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden"}
            return web.json_response(
                {**status, "code": self.scenario.create_status, "message": "nope"}, status=403
            )
        name = body["metadata"]["name"]
        root = self._tmp / name
        root.mkdir()
        self.pods[name] = FakePod(body, root)
        self.created.append(body)
        return web.json_response(body, status=201)

    def _status(self, pod: FakePod) -> dict[str, Any]:
        container = pod.manifest["spec"]["containers"][0]
        st: dict[str, Any] = {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
        }
        if pod.terminated is not None:
            st["state"] = {"terminated": pod.terminated}
            return {"phase": "Failed", "containerStatuses": [st]}
        if self.scenario.waiting_reason and pod.polls > 1:
            st["state"] = {"waiting": {"reason": self.scenario.waiting_reason}}
            return {"phase": "Pending", "containerStatuses": [st]}
        if self.scenario.pending_forever or pod.polls < 2:
            return {"phase": "Pending"}
        st["state"] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        st["ready"] = True
        return {"phase": "Running", "containerStatuses": [st]}

    async def read_pod(self, request: web.Request) -> web.Response:
        self._record(request)
        pod = self.pods.get(request.match_info["name"])
        if pod is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 404}, status=404)
        pod.polls += 1
        return web.json_response({**pod.manifest, "status": self._status(pod)})

    async def delete_pod(self, request: web.Request) -> web.Response:
        self._record(request)
        name = request.match_info["name"]
        pod = self.pods.pop(name, None)
        if pod is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 404}, status=404)
        shutil.rmtree(pod.root, ignore_errors=True)
        self.deleted.append(name)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    # -- exec -----------------------------------------------------------------------------------------------
    def _container_argv(self, pod: FakePod, command: list[str]) -> list[str]:
        argv = ["bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if Path("/", link).is_symlink():
                argv += ["--symlink", f"usr/{link}", f"/{link}"]
        argv += ["--tmpfs", "/tmp"]  # first: a checkout under /tmp (a CI clone) is bound on top of it
        for root in PY_ROOTS:
            argv += ["--ro-bind", str(root), str(root)]
        argv += ["--bind", str(pod.root), "/workspace", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--unshare-pid", "--die-with-parent", "--clearenv", "--chdir", "/", "--", *command]
        env = {e["name"]: e["value"] for e in pod.manifest["spec"]["containers"][0]["env"]}
        env["PATH"] = f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        env["PYTHONPATH"] = "/workspace"  # the "image" has the repo installed in development mode
        at = argv.index("--clearenv") + 1
        argv[at:at] = [a for k, v in env.items() for a in ("--setenv", k, v)]
        return argv

    async def exec_pod(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        pod = self.pods.get(request.match_info["name"])
        command = request.query.getall("command")
        self.execs.append(command)
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        if pod is None or pod.terminated is not None:
            await ws.close()
            return ws
        if self.scenario.oom_marker is not None and any(self.scenario.oom_marker in c for c in command):
            # the kernel kills the container for memory: the stream ends without a status. The command is
            # not run at all: killing a real process here raced its own exit (a command that ends before
            # the kill made `kill` raise, and the stream never closed) on a loaded machine.
            pod.terminated = {"exitCode": 137, "reason": "OOMKilled"}
            await ws.close()
            return ws
        argv = self._container_argv(pod, command)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        async def pump(stream: asyncio.StreamReader, channel: int) -> None:
            while chunk := await stream.read(65536):
                await ws.send_bytes(bytes([channel]) + chunk)

        async def feed() -> None:
            async for msg in ws:
                if msg.type in (WSMsgType.BINARY, WSMsgType.TEXT):
                    data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                    if data[:1] == b"\x00" and proc.returncode is None:
                        try:
                            proc.stdin.write(data[1:])  # type: ignore[union-attr]
                            await proc.stdin.drain()  # type: ignore[union-attr]
                        except (BrokenPipeError, ConnectionResetError):
                            pass

        feeder = asyncio.ensure_future(feed())
        pumps = asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        done, _ = await asyncio.wait({pumps, feeder}, return_when=asyncio.FIRST_COMPLETED)
        if feeder in done:  # the client went away: kill the command, as the kubelet does
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                proc.kill()
            await proc.wait()
            pumps.cancel()
            return ws
        code = await proc.wait()
        feeder.cancel()
        if code == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        await ws.send_bytes(b"\x03" + json.dumps(status).encode())
        await ws.close()
        return ws

    # -- server ---------------------------------------------------------------------------------------------
    def start(self) -> KubeAPI:
        app = web.Application()
        base = "/api/v1/namespaces/{ns}/pods"
        app.router.add_post(base, self.create_pod)
        app.router.add_get(base + "/{name}", self.read_pod)
        app.router.add_delete(base + "/{name}", self.delete_pod)
        app.router.add_get(base + "/{name}/exec", self.exec_pod)
        app.router.add_post(base + "/{name}/exec", self.exec_pod)
        self.base_url = self._server.start(app)
        return self

    def stop(self) -> None:
        self._server.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig pointing at this server (what `config.load_kube_config` reads)."""
        return loopback_kubeconfig(self.base_url, path)
