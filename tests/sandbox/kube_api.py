"""A loopback Kubernetes API for the pod sandbox: pods (create / read / delete) as JSON over HTTP, and the exec
subresource as a real websocket speaking `v4.channel.k8s.io` (channel byte 0 stdin, 1 stdout, 2 stderr,
3 the final Status). Behind it, a stand-in kubelet: each pod is a directory, and an exec runs the command for
real in bubblewrap with that directory at /workspace (host /usr, /etc and this Python read-only), with the
pod's env; this stand-in "image" has the workspace on PYTHONPATH, as task images install their repo. The
pod's other emptyDir volumes are directories of their own, mounted where its containers mount them; its init
containers run to completion when it is created and its other containers run beside it until it is deleted,
in bubblewrap too, from a stand-in agent image: the host's /usr, /etc, this Python, this checkout and
HARNESSRL_CACHE (the pinned CLIs) read-only. What a real cluster decides on its own is scripted per test: image pull failures, pods that never
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
REPO = Path(__file__).resolve().parents[2]
SANDBOX = "sandbox"  # the container commands are exec'd in; the others run from the stand-in agent image


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
    volumes: dict[str, Path] = field(default_factory=dict)  # emptyDir name -> its directory (not tmp)
    running: list[asyncio.subprocess.Process] = field(default_factory=list)  # its other containers


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
        pod = FakePod(body, root)
        for volume in body["spec"]["volumes"]:
            if volume["name"] not in ("workspace", "tmp"):
                pod.volumes[volume["name"]] = self._tmp / f"{name}.{volume['name']}"
                pod.volumes[volume["name"]].mkdir()
        self.pods[name] = pod
        self.created.append(body)
        for init in body["spec"].get("initContainers", []):
            proc = await asyncio.create_subprocess_exec(
                *self._container_argv(pod, init["command"], init), stderr=asyncio.subprocess.PIPE
            )
            _, err = await proc.communicate()
            if proc.returncode != 0:
                pod.terminated = {
                    "exitCode": proc.returncode,
                    "reason": "Init:Error",
                    "message": err.decode(),
                }
                return web.json_response(body, status=201)
        for container in body["spec"]["containers"][1:]:
            pod.running.append(
                await asyncio.create_subprocess_exec(
                    *self._container_argv(pod, container["command"], container), start_new_session=True
                )
            )
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
        for proc in pod.running:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        shutil.rmtree(pod.root, ignore_errors=True)
        for directory in pod.volumes.values():
            shutil.rmtree(directory, ignore_errors=True)
        self.deleted.append(name)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    # -- exec -----------------------------------------------------------------------------------------------
    def _container_argv(
        self, pod: FakePod, command: list[str], container: dict[str, Any] | None = None
    ) -> list[str]:
        """`command` in `container` of `pod` (default: the sandbox container, where execs run)."""
        from harnessrl.harness.cli_agents import cache_root

        box: dict[str, Any] = container if container is not None else pod.manifest["spec"]["containers"][0]
        argv = ["bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if Path("/", link).is_symlink():
                argv += ["--symlink", f"usr/{link}", f"/{link}"]
        mounts = box.get("volumeMounts", [])
        if any(m["name"] == "tmp" for m in mounts) or box["name"] != SANDBOX:
            argv += ["--tmpfs", "/tmp"]  # first: a checkout under /tmp (a CI clone) is bound on top of it
        roots = PY_ROOTS if box["name"] == SANDBOX else [*PY_ROOTS, REPO, cache_root()]
        for root in roots:
            if root.exists():
                argv += ["--ro-bind", str(root), str(root)]
        for m in mounts:
            if m["name"] == "workspace":
                argv += ["--bind", str(pod.root), m["mountPath"]]
            elif m["name"] in pod.volumes:
                argv += [
                    "--ro-bind" if m.get("readOnly") else "--bind",
                    str(pod.volumes[m["name"]]),
                    m["mountPath"],
                ]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--unshare-pid", "--die-with-parent", "--clearenv", "--chdir", "/", "--", *command]
        env = {e["name"]: e["value"] for e in box.get("env", [])}
        env["PATH"] = f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        # the sandbox "image" has the repo installed in development mode, the agent image this checkout
        env["PYTHONPATH"] = "/workspace" if box["name"] == SANDBOX else str(REPO)
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
