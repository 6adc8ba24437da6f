"""A loopback HTTP server answering the KFP v2beta1 REST calls kfp.Client makes, recording every request.

Its replies follow the kfp-server-api 2.x models (V2beta1Experiment, V2beta1Run, V2beta1Pipeline,
V2beta1PipelineVersion, V2beta1GetHealthzResponse); it keeps just enough state (experiments, pipelines,
versions) for get-or-create flows.
"""

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

NOW = "2026-01-01T00:00:00Z"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class KfpState:
    requests: list = field(default_factory=list)
    experiments: list = field(default_factory=list)
    pipelines: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)  # pipeline_id -> [version]

    def find(self, method, path):
        return [r for r in self.requests if r.method == method and r.path == path]


def _filter_value(query):
    raw = query.get("filter", [""])[0]
    if not raw:
        return None
    preds = json.loads(raw).get("predicates", [])
    return preds[0].get("stringValue", preds[0].get("string_value")) if preds else None


def make_handler(state: KfpState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _reply(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = urlparse(self.path)
            rec = Recorded(
                self.command,
                url.path,
                parse_qs(url.query),
                {k.lower(): v for k, v in self.headers.items()},
                body,
            )
            state.requests.append(rec)
            return rec

        def do_GET(self):
            rec = self._record()
            if rec.path == "/apis/v2beta1/healthz":
                return self._reply(200, {"commit_sha": "abc", "tag_name": "2.5.0", "multi_user": False})
            if rec.path == "/apis/v2beta1/experiments":
                name = _filter_value(rec.query)
                found = [e for e in state.experiments if name is None or e["display_name"] == name]
                return self._reply(200, {"experiments": found, "total_size": len(found)} if found else {})
            if rec.path == "/apis/v2beta1/pipelines":
                name = _filter_value(rec.query)
                found = [p for p in state.pipelines if name is None or p["display_name"] == name]
                return self._reply(200, {"pipelines": found, "total_size": len(found)} if found else {})
            parts = rec.path.split("/")
            if rec.path.startswith("/apis/v2beta1/pipelines/") and parts[-1] == "versions":
                versions = state.versions.get(parts[-2], [])
                return self._reply(200, {"pipeline_versions": versions[::-1], "total_size": len(versions)})
            return self._reply(404, {"code": 5, "message": f"no route {rec.path}"})

        def do_POST(self):
            rec = self._record()
            if rec.path == "/apis/v2beta1/experiments":
                body = rec.json()
                exp = {
                    "experiment_id": str(uuid.uuid4()),
                    "display_name": body["display_name"],
                    "namespace": body.get("namespace") or "",
                    "created_at": NOW,
                    "storage_state": "AVAILABLE",
                }
                state.experiments.append(exp)
                return self._reply(200, exp)
            if rec.path == "/apis/v2beta1/runs":
                body = rec.json()
                return self._reply(
                    200,
                    {
                        "run_id": str(uuid.uuid4()),
                        "experiment_id": body.get("experiment_id"),
                        "display_name": body.get("display_name"),
                        "state": "PENDING",
                        "created_at": NOW,
                        "storage_state": "AVAILABLE",
                    },
                )
            if rec.path == "/apis/v2beta1/pipelines/upload":
                pid = str(uuid.uuid4())
                name = rec.query.get("name", ["?"])[0]
                pipeline = {"pipeline_id": pid, "display_name": name, "name": name, "created_at": NOW}
                state.pipelines.append(pipeline)
                state.versions[pid] = [
                    {
                        "pipeline_id": pid,
                        "pipeline_version_id": str(uuid.uuid4()),
                        "display_name": name,
                        "created_at": NOW,
                    }
                ]
                return self._reply(200, pipeline)
            if rec.path == "/apis/v2beta1/pipelines/upload_version":
                pid = rec.query["pipelineid"][0]
                version = {
                    "pipeline_id": pid,
                    "pipeline_version_id": str(uuid.uuid4()),
                    "display_name": rec.query.get("name", ["?"])[0],
                    "created_at": NOW,
                }
                state.versions.setdefault(pid, []).append(version)
                return self._reply(200, version)
            return self._reply(404, {"code": 5, "message": f"no route {rec.path}"})

    return Handler


@pytest.fixture
def kfp_api():
    """(base URL, KfpState) of a recording KFP API server on a free loopback port."""
    state = KfpState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()
