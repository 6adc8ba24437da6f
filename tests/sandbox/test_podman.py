"""The podman sandbox (harnessrl/sandbox/podman.py) on a real task's environment image: a rollout's commands
in one container, verification in a fresh one, limits, no network but the gateway socket, teardown."""

from __future__ import annotations

import http.server
import re
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.sandbox import identity
from harnessrl.sandbox.backends import SandboxChoice
from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.podman import PodmanSandbox
from harnessrl.schema import SandboxKind
from harnessrl.verify.verifier import verify_workspace
from tests.sandbox.podman_fixtures import requires_podman

pytestmark = requires_podman
PODMAN = SandboxChoice(SandboxKind.PODMAN)


def _container_exists(name: str) -> bool:
    return subprocess.run(["podman", "container", "exists", name]).returncode == 0


def _containers() -> set[str]:
    return set(subprocess.run(["podman", "ps", "-aq"], capture_output=True, text=True).stdout.split())


def _back_to(before: set[str], within_s: float = 30.0) -> bool:
    """close() kills the container's init at once; podman removes the container (--rm) in the background."""
    deadline = time.monotonic() + within_s
    while _containers() - before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_rollout_runs_its_commands_in_one_container(podman_task, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    ws = podman_task.workspace(tmp_path / "ws")
    image = podman_task.row["image_name"]
    sb = PodmanSandbox(ws, image, Limits())
    with sb:
        first = sb.run("id -u; echo edited > NOTE; env", timeout=30)
        log = sb.run("git log --all --oneline; cat NOTE", timeout=30)
        tests = sb.run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], timeout=60)
        module = podman_task.module().split("/")[0].removesuffix(".py")
        where = sb.run(["python", "-c", f"import {module}; print({module}.__file__)"], cwd="/tmp", timeout=30)
        rootfs = sb.run("touch /usr/evil", timeout=30)
        daemon = sb.run("(setsid sleep 300 &); echo started", timeout=30)
        after = sb.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout=30)
        name = sb.name
        assert _container_exists(name)
    assert _back_to(_containers() - {name})  # torn down at close
    assert first.outcome is Outcome.OK, first.stderr
    uid = int(first.stdout.split()[0])
    assert uid != 0 and "host-secret" not in first.stdout and "AWS_SECRET" not in first.stdout
    assert (ws / "NOTE").read_text() == "edited\n"  # the bound workspace, persistent across commands
    assert log.stdout.split("\n")[0].endswith("Initial commit") and len(log.stdout.splitlines()) == 2
    # the image's pytest runs the workspace's tests (the F2P tests are not in it); the repo imports from the
    # mounted workspace wherever the command runs, as an editable install would
    assert tests.outcome is Outcome.OK and " passed" in tests.stdout, tests.stdout[-1000:]
    assert where.outcome is Outcome.OK and where.stdout.startswith("/workspace/"), where.stderr
    assert rootfs.outcome is Outcome.NONZERO and "Read-only file system" in rootfs.stderr
    assert daemon.outcome is Outcome.OK and "sleep 300" not in after.stdout  # nothing outlives a command


def test_a_generate_rollout_on_the_podman_backend(env_taskset, fast_engine, tmp_path):
    """generate with a podman spec: the harness's edits and the agent's commands meet in one container of the
    task's image, the container's writes come back in the diff, and the container goes at the end."""
    import json

    from harnessrl.io import read_jsonl
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.rollout.specs import parse_specs

    def call(name: str, **arguments: str) -> dict:
        return {"text": f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"}

    engine = fast_engine(
        [
            call(
                "str_replace_editor", command="create", path="NOTES.md", file_text="edited by the harness\n"
            ),
            call("bash", command="cat NOTES.md > COPY.md && echo uid=$(id -u) && hostname"),
            call("submit"),
        ]
    )
    before = _containers()
    run_generate(
        env_taskset,
        tmp_path / "gen",
        parse_specs({"sandbox": "podman", "limits": {"turns": 4}}),
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=1, max_tasks=1),
    )
    (row,) = read_jsonl(tmp_path / "gen" / "rollouts.jsonl")
    assert row["rollout_status"] == "ok" and row["finish_reason"] == "submitted", row["error"]
    assert "+++ b/COPY.md" in row["model_patch"] and "+edited by the harness" in row["model_patch"]
    transcript = next((tmp_path / "gen" / "transcripts").glob("*.json")).read_text()
    uid = re.search(r"uid=(\d+)\\nsandbox", transcript)
    # the command ran as a sandbox uid of the podman backend (bubblewrap would show uid 1000 inside)
    assert uid is not None and int(uid.group(1)) > identity.uid_base(), transcript[-2000:]
    assert _back_to(before)


def test_verification_in_a_fresh_container(podman_task, tmp_path):
    gold = podman_task.workspace(tmp_path / "gold")
    podman_task.apply_gold(gold)
    unfixed = podman_task.workspace(tmp_path / "unfixed")
    (unfixed / "NOTES.txt").write_text("a change that fixes nothing\n")  # not empty: its tests run
    before = _containers()
    resolved = verify_workspace(podman_task.taskset, podman_task.row, gold, timeout_s=120, sandbox=PODMAN)
    unresolved = verify_workspace(
        podman_task.taskset, podman_task.row, unfixed, timeout_s=120, sandbox=PODMAN
    )
    assert resolved.status == "resolved" and resolved.reward == 1.0, (
        resolved.detail,
        resolved.test_log[-2000:],
    )
    assert unresolved.status == "unresolved" and unresolved.reward == 0.0, unresolved.detail
    assert unresolved.timings.get("tests_s"), "the unfixed tree's tests ran in a container"
    assert _back_to(before)  # each verification's container is gone


def test_a_missing_image_is_a_sandbox_error_not_the_agents(tmp_path):
    from harnessrl.sandbox.base import SandboxError

    with pytest.raises(SandboxError, match="no-such-image"):
        PodmanSandbox(tmp_path, "localhost/no-such-image:1", Limits())


@pytest.mark.parametrize(
    "cmd, limits, detail",
    [
        ("python -c \"b = b'x' * (1 << 30)\"", Limits(memory_mb=128), "memory limit"),
        ("python -c 'import os\nwhile True: os.fork()'", Limits(processes=16), "process limit"),
        ("python -c 'while True: pass'", Limits(cpu_s=1), "SIGXCPU"),
        ("head -c 3000000 /dev/zero > big", Limits(file_size_mb=1), "SIGXFSZ|file size"),
    ],
    ids=["memory", "processes", "cpu", "file-size"],
)
def test_limits_hit_are_resource_limit(podman_task, tmp_path, monkeypatch, cmd, limits, detail):
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    (tmp_path / "ws").mkdir()
    with PodmanSandbox(tmp_path / "ws", podman_task.row["image_name"], limits) as sb:
        r = sb.run(cmd, timeout=60)
        ok = sb.run("echo alive", timeout=30)
    assert r.outcome is Outcome.RESOURCE_LIMIT and re.search(detail, r.detail), (r.detail, r.stderr[-500:])
    assert ok.outcome is Outcome.OK  # the sandbox survives its command hitting a limit
    assert list(caller.iterdir()) == []  # podman's conmon dropped an `oom` file in the caller's cwd once


def test_timeout_kills_the_command_and_its_children(podman_task, tmp_path):
    with PodmanSandbox(tmp_path, podman_task.row["image_name"], Limits()) as sb:
        r = sb.run("(setsid sh -c 'while true; do date >> beat; sleep 0.1; done' &); sleep 100", timeout=2)
        size = (tmp_path / "beat").stat().st_size
        later = sb.run("sleep 1; wc -c < beat", timeout=30)
    assert r.outcome is Outcome.TIMEOUT and r.wall_s < 30
    assert int(later.stdout) == size  # the setsid loop died with the command


def test_no_network_but_the_gateway_socket(podman_task, tmp_path):
    class Reply(socketserver.StreamRequestHandler):
        def handle(self):
            self.rfile.readline()
            self.wfile.write(b"gateway-ok\n")

    sock = tmp_path / "gw.sock"
    unix = socketserver.ThreadingUnixStreamServer(str(sock), Reply)
    tcp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    for server in (unix, tcp):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    client = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['HARNESSRL_GATEWAY_SOCKET'])\n"
        "s.sendall(b'hello\\n'); print(s.makefile().readline().strip())\n"
        f"for addr in [('127.0.0.1', {tcp.server_address[1]}), ('1.1.1.1', 53)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
        "    except OSError as e:\n        print('blocked', addr, e)\n"
    )
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        with PodmanSandbox(ws, podman_task.row["image_name"], Limits(), gateway_socket=sock) as sb:
            r = sb.run(["python", "-c", client], timeout=30)
    finally:
        unix.shutdown()
        tcp.shutdown()
    assert r.outcome is Outcome.OK, r.stderr
    assert "gateway-ok" in r.stdout and r.stdout.count("blocked") == 2 and "CONNECTED" not in r.stdout


def test_a_killed_runs_container_is_swept(podman_task, tmp_path):
    """A process that dies without close() leaves its container; the next process's first sandbox removes it."""
    script = (
        "import os\nfrom pathlib import Path\nfrom harnessrl.sandbox.podman import PodmanSandbox\n"
        "from harnessrl.sandbox.base import Limits\n"
        f"sb = PodmanSandbox(Path({str(tmp_path)!r}), {podman_task.row['image_name']!r}, Limits())\n"
        "print(sb.name, flush=True)\nos._exit(0)\n"
    )
    name = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    ).stdout.strip()
    assert _container_exists(name)
    sweep = "from harnessrl.sandbox import podman\npodman._sweep_once()\n"
    subprocess.run([sys.executable, "-c", sweep], check=True, cwd=Path(__file__).parents[2])
    assert not _container_exists(name)
