"""The bubblewrap backend, for real: isolation, limits and typed outcomes."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.sandbox.base import Limits, Outcome, SandboxError
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from tests.sandbox.support import descendants
from tests.support.fixtures import requires_bwrap

pytestmark = requires_bwrap


@pytest.fixture
def ws(tmp_path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def host_env(tmp_path) -> Path:
    """A venv like envs.ensure_env makes, over this interpreter's site-packages (pytest inside)."""
    import json
    import subprocess
    import sysconfig

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next(env.glob("lib/python*/site-packages"))
    host = sysconfig.get_paths()["purelib"]
    (site / "00-host.pth").write_text(host + "\n")
    (env / "harnessrl-env.json").write_text(json.dumps({"ro_paths": [host]}))
    return env


def test_environment_is_cleared_and_host_files_are_hidden(ws, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret-123")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    with BubblewrapSandbox(ws) as sb:
        r = sb.run(
            "env; echo ---; ls -a /; ls -a /root /home 2>&1; cat /etc/shadow 2>&1 | head -1", timeout=10
        )
    assert r.outcome is Outcome.OK
    env_part, rest = r.stdout.split("---", 1)
    assert "AWS_SECRET_ACCESS_KEY" not in env_part and "host-secret-123" not in r.stdout
    assert "HF_TOKEN" not in env_part
    assert "No such file" in rest  # neither /root nor /home nor /etc/shadow exist inside
    assert set(rest.split()) >= {"usr", "etc", "workspace", "tmp", "proc", "dev"}


def test_read_only_system_writable_persistent_workspace_private_tmp(ws):
    with BubblewrapSandbox(ws) as sb:
        a = sb.run("echo one > note.txt && touch /usr/x", timeout=10)
        b = sb.run("cat note.txt; echo two >> note.txt; echo t > /tmp/t; ls /tmp", timeout=10)
        c = sb.run("cat /tmp/t", timeout=10)
    assert a.outcome is Outcome.NONZERO and "Read-only file system" in a.stderr
    assert b.outcome is Outcome.OK and b.stdout.startswith("one")
    assert (ws / "note.txt").read_text() == "one\ntwo\n"
    assert c.outcome is Outcome.NONZERO  # each command gets a fresh private /tmp


def test_harness_tools_work_inside(ws, host_env):
    (ws / "mod.py").write_text("def f():\n    return 1\n")
    (ws / "test_mod.py").write_text("from mod import f\n\ndef test_f():\n    assert f() == 1\n")
    with BubblewrapSandbox(ws, host_env, git_stub=False) as sb:
        r = sb.run(
            "python -c 'import sys; print(sys.prefix)' && sed -i s/1/2/ mod.py && grep -c 2 mod.py && "
            "git init -q . && git add -A && git -c user.name=a -c user.email=a@b commit -qm x && "
            "git log --oneline | wc -l && python -P -m pytest -q -p no:cacheprovider test_mod.py",
            timeout=60,
        )
    assert r.outcome is Outcome.NONZERO, r.stdout  # the edited function now fails its test
    assert str(host_env) in r.stdout and "1 failed" in r.stdout


def test_no_network_but_the_gateway_socket(ws, tmp_path):
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"gateway-ok")

        def log_message(self, format: str, *args: object) -> None:  # the base class's name
            pass

    class UnixHTTPServer(http.server.ThreadingHTTPServer):
        address_family = socket.AF_UNIX

        def server_bind(self):
            socket.socket.bind(self.socket, self.server_address)
            self.server_name, self.server_port = "gateway", 0

        def get_request(self):
            conn, _ = self.socket.accept()
            return conn, ("gateway", 0)

    sock_path = tmp_path / "gw.sock"
    unix = UnixHTTPServer(str(sock_path), Hello)  # pyright: ignore[reportArgumentType] - AF_UNIX: a path
    tcp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    for s in (unix, tcp):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    client = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['HARNESSRL_GATEWAY_SOCKET'])\n"
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "reply = b''.join(iter(lambda: s.recv(4096), b''))\n"  # headers and body may arrive in separate reads
        "print(reply.decode().split()[-1])\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {tcp.server_address[1]}), timeout=2); print('TCP-REACHED')\n"
        "except OSError as e:\n    print('tcp blocked:', e)\n"
    )
    try:
        with BubblewrapSandbox(ws, None, gateway_socket=sock_path) as sb:
            r = sb.run(["python3", "-c", client], timeout=20)
    finally:
        unix.shutdown()
        tcp.shutdown()
    assert r.outcome is Outcome.OK, r.stderr
    assert "gateway-ok" in r.stdout and "tcp blocked" in r.stdout and "TCP-REACHED" not in r.stdout


def test_timeout_kills_the_whole_process_tree(ws):
    script = "(setsid sh -c 'while true; do date +%s%N >> beat; sleep 0.1; done' &) ; sleep 100"
    with BubblewrapSandbox(ws) as sb:
        t0 = time.monotonic()
        r = sb.run(script, timeout=1.5)
    assert r.outcome is Outcome.TIMEOUT and r.exit_code is None and time.monotonic() - t0 < 10
    size = (ws / "beat").stat().st_size
    time.sleep(0.6)
    assert (ws / "beat").stat().st_size == size  # the detached child died with the sandbox


@pytest.mark.parametrize(
    "cmd, limits",
    [
        (["python3", "-c", "b = b'x' * (1 << 30)"], Limits(memory_mb=256)),
        (["python3", "-c", "import os\nwhile True:\n    os.fork()"], Limits(processes=32)),
        (["python3", "-c", "open('big', 'wb').write(b'x' * (64 << 20))"], Limits(file_size_mb=8)),
        (["python3", "-c", "while True: pass"], Limits(cpu_s=1)),
    ],
    ids=["memory", "processes", "file-size", "cpu"],
)
@pytest.mark.parametrize("enforcement", ["cgroup", "rlimit"])
def test_resource_limits(ws, cmd, limits, enforcement, monkeypatch):
    from harnessrl.sandbox import cgroups

    if enforcement == "cgroup" and not cgroups.factory().available():
        pytest.skip("no writable cgroup hierarchy on this host")
    if (
        enforcement == "rlimit"
    ):  # as root too: sandboxed code runs as a host uid of its own, which NPROC binds
        fallback = cgroups.CgroupFactory.__new__(cgroups.CgroupFactory)
        fallback.version, fallback.parents = 0, {}
        monkeypatch.setattr(cgroups, "_factory", fallback)
    with BubblewrapSandbox(ws) as sb:
        r = sb.run(
            cmd, timeout=30, limits=limits
        )  # generous: a loaded host must not turn a limit into a timeout
    assert r.outcome is Outcome.RESOURCE_LIMIT, (r.outcome, r.detail, r.stderr[-500:])
    assert r.detail
    assert descendants(os.getpid()) == []  # the sandbox left nothing running
    if (ws / "big").exists():
        assert (ws / "big").stat().st_size <= 8 << 20


def test_outcomes_ok_nonzero_and_sandbox_error(ws):
    with BubblewrapSandbox(ws) as sb:
        ok = sb.run(["true"], timeout=5)
        bad = sb.run("exit 3", timeout=5)
        missing = sb.run(["no-such-program"], timeout=5)
        broken = sb.run(["true"], timeout=5, cwd="/no/such/dir")
    assert (ok.outcome, ok.exit_code) == (Outcome.OK, 0)
    assert (bad.outcome, bad.exit_code) == (Outcome.NONZERO, 3)
    assert (missing.outcome, missing.exit_code) == (Outcome.NONZERO, 127)
    assert (
        broken.outcome is Outcome.SANDBOX_ERROR and broken.infra_error and "sandbox failed" in broken.detail
    )


def test_bad_construction_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(SandboxError, match="not a directory"):
        BubblewrapSandbox(tmp_path / "missing")
    with pytest.raises(SandboxError, match="no bin/python"):
        BubblewrapSandbox(tmp_path, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        BubblewrapSandbox(tmp_path)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)


def test_output_is_capped(ws):
    with BubblewrapSandbox(ws) as sb:
        r = sb.run("head -c 10000000 /dev/zero | tr '\\0' a", timeout=20)
    assert r.outcome is Outcome.OK and len(r.stdout) < 3 << 20 and "truncated" in r.stdout


def test_a_closed_or_forgotten_sandbox_releases_what_it_held_and_never_runs_again(ws):
    import fcntl
    import gc

    from harnessrl.sandbox import identity

    def holds(sb: BubblewrapSandbox) -> tuple[list[Path], Path | None]:
        assert sb.run(["true"], timeout=10).ok
        lock = identity.LOCK_DIR / f"{sb.identity.uid}.lock" if sb.identity is not None else None
        return list(sb._temp_dirs), lock

    def released(lock: Path | None) -> bool:
        if lock is None:
            return True
        with open(lock) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        return True

    sb = BubblewrapSandbox(ws, git_stub=True)
    dirs, lock = holds(sb)
    assert dirs and all(d.exists() for d in dirs) and not released(lock)
    sb.close()
    assert not any(d.exists() for d in dirs) and released(lock)
    with pytest.raises(SandboxError, match="closed"):
        sb.run(["true"], timeout=10)
    forgotten = BubblewrapSandbox(ws, git_stub=True)  # as a caller that never calls close()
    dirs, lock = holds(forgotten)
    del forgotten
    gc.collect()
    assert not any(d.exists() for d in dirs) and released(lock)
