"""A loopback server speaking the API shapes of a KubeRay RayJob's lifecycle: RayJobs (create / get / delete, the
status moving Initializing -> Running -> Complete | Failed as the driver runs), the submitter pod found by its
`job-name` label, and that pod's followed log (chunked, a line every 50 ms; the driver ends with the log)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from aiohttp import web
from kubernetes import client

from tests.support.loopback import ThreadedServer, loopback_kubeconfig


class RayAPI:
    """RayJobs (create / get / delete) and the submitter pod's followed log, over loopback HTTP."""

    def __init__(self, final: str = "SUCCEEDED", lines: int = 5, exists: bool = False, stuck: bool = False):
        self.final, self.lines, self.stuck = final, lines, stuck
        self.objects: dict[str, dict] = {}
        self.created: list[dict] = []  # every RayJob body POSTed, kept after its deletion
        self.requests: list[tuple[str, str, dict]] = []
        self.polls = 0
        self.driver_done = threading.Event()
        self.terminal_at: float | None = None
        self.exists = exists
        self._server = ThreadedServer("ray-api", shutdown_timeout=0.5)
        self.base_url = ""

    def _record(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path, dict(request.query)))

    async def create(self, request: web.Request) -> web.Response:
        self._record(request)
        body = await request.json()
        name = body["metadata"]["name"]
        if name in self.objects:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists"}
            return web.json_response({**status, "code": 409}, status=409)
        self.objects[name] = body
        self.created.append(body)
        return web.json_response(body, status=201)

    async def get(self, request: web.Request) -> web.Response:
        self._record(request)
        obj = self.objects.get(request.match_info["name"])
        if obj is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 404}, status=404)
        self.polls += 1
        if self.polls == 1 or self.stuck:
            status = {"jobDeploymentStatus": "Initializing"}
        elif not self.driver_done.is_set():
            status = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": "rl-1"}
        else:
            self.terminal_at = self.terminal_at or time.monotonic()
            done = "Complete" if self.final == "SUCCEEDED" else "Failed"
            status = {"jobDeploymentStatus": done, "jobStatus": self.final, "jobId": "rl-1"}
            if self.final == "FAILED":
                status["message"] = "Job entrypoint command failed with exit code 1"
        return web.json_response({**obj, "status": status})

    async def delete(self, request: web.Request) -> web.Response:
        self._record(request)
        if self.objects.pop(request.match_info["name"], None) is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 404}, status=404)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    async def pods(self, request: web.Request) -> web.Response:
        self._record(request)
        job = request.query["labelSelector"].split("=", 1)[1]
        items = []
        if job in self.objects and self.polls >= 2:
            items = [{"metadata": {"name": f"{job}-x7k2p"}, "status": {"phase": "Running"}}]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def log(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for i in range(self.lines):
            await resp.write(f"step {i} reward 0.{i}\n".encode())
            await asyncio.sleep(0.05)
        self.driver_done.set()
        await resp.write_eof()
        return resp

    def start(self) -> RayAPI:
        app = web.Application()
        jobs = "/apis/ray.io/v1/namespaces/{ns}/rayjobs"
        app.router.add_post(jobs, self.create)
        app.router.add_get(jobs + "/{name}", self.get)
        app.router.add_delete(jobs + "/{name}", self.delete)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/log", self.log)
        self.base_url = self._server.start(app)
        return self

    def stop(self) -> None:
        self._server.stop()

    def api_client(self) -> client.ApiClient:
        conf = client.Configuration()
        conf.host = self.base_url
        return client.ApiClient(conf)

    def kubeconfig(self, path: Path) -> Path:
        return loopback_kubeconfig(self.base_url, path)
