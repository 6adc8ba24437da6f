"""The child process of tests/core/test_launch_under_memory_pressure.py: grows its own private writable memory
past the machine's RAM + swap without touching it, checks that the kernel would now refuse to fork() it, then
starts one kind of child the product starts, through the product's own code, and prints one JSON line.

    python -m tests.support.memory_pressure KIND WORKDIR

The reservation is one anonymous private mapping (what a heap, a model's weights or an engine's arenas are),
grown by mremap (`mmap.resize`) in steps that are each below RAM + swap: the overcommit heuristic judges each
request alone, so every step is granted. A fork() must commit a copy of every accounted private writable
mapping, and under vm.overcommit_memory=0 the kernel refuses one larger than RAM + swap (mm/util.c,
`__vm_enough_memory`). The child reads that from the kernel's own view of its mapping (/proc/self/smaps: its
size and the `ac` — accounted — and `wr` flags) instead of forking to see the refusal: a real refusal is logged
by the kernel as a failed allocation, which the machine's checks rightly count as a fault (the refusal itself
was reproduced when the issue was found). The JSON line: `reserved_gib`, `fork_refused` (the kernel's rule
holds for the mapping), `started` (what the launch showed), or `skip` (why the precondition does not hold
here). A launch that fails raises: the exit status says so. `probe_image()` (called by the test beforehand)
makes the image of the podman case.
"""

import ctypes
import io
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

PROBE_IMAGE = "localhost/harnessrl-launch-probe:1"  # sh and sleep: what a podman sandbox's container needs
RESERVE_FACTOR = 1.5  # the mapping's size over RAM + swap
STEPS = 3  # the mapping grows in this many steps, each RESERVE_FACTOR / STEPS of RAM + swap
EXEC_WITHIN_S = 60.0


def memory_limit() -> int:
    """RAM + swap in bytes: the most one request may ask for under vm.overcommit_memory=0."""
    info = dict(re.findall(r"^(\w+):\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M))
    return (int(info["MemTotal"]) + int(info.get("SwapTotal", 0))) * 1024


def reserve(total: int, steps: int) -> mmap.mmap:
    step = -(-total // steps)
    reserved = mmap.mmap(-1, step, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(2, steps + 1):
        reserved.resize(step * i)
    return reserved


def fork_refused(reserved: mmap.mmap, limit: int) -> bool:
    """Whether the kernel would refuse to fork this process for `reserved` alone: the mapping is accounted,
    private and writable, and larger than RAM + swap (`limit`), as /proc/self/smaps shows it."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(reserved))
    size, flags = 0, set()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16) and span[3].endswith("p")
        elif inside and line.startswith("Size:"):
            size = int(line.split()[1]) * 1024
        elif inside and line.startswith("VmFlags:"):
            flags = set(line.split()[1:])
    return {"ac", "wr"} <= flags and size > limit


# -- the launches: each starts one kind of child through the product's code, and says what it saw ----------
def bwrap(work: Path) -> str:
    from harnessrl.sandbox.base import Outcome
    from harnessrl.sandbox.bwrap import BubblewrapSandbox

    sandbox = BubblewrapSandbox(_workspace(work), None)
    try:
        run = sandbox.run(["/bin/sh", "-c", 'echo "started in $PWD"'], timeout=60)
    finally:
        sandbox.close()
    assert run.outcome is Outcome.OK, run
    return run.stdout.strip()


def podman(work: Path) -> str:
    """A podman sandbox's container of PROBE_IMAGE (probe_image() makes it beforehand)."""
    from harnessrl.sandbox.base import Limits, Outcome
    from harnessrl.sandbox.podman import PodmanSandbox

    with PodmanSandbox(_workspace(work), PROBE_IMAGE, Limits()) as sandbox:
        run = sandbox.run(["/bin/sh", "-c", 'echo "started in $PWD"'], timeout=60)
    assert run.outcome is Outcome.OK, run
    return run.stdout.strip()


def cli_agent(work: Path) -> str:
    """The pinned Claude Code, bound into a bubblewrap sandbox at its mount as its harness does."""
    from harnessrl.harness.claude_code import ClaudeCodeConfig
    from harnessrl.harness.cli_agents import CLAUDE_CODE, require
    from harnessrl.harness.cli_episode import cli_limits
    from harnessrl.sandbox.base import Outcome
    from harnessrl.sandbox.bwrap import BubblewrapSandbox

    cli = require(CLAUDE_CODE)
    sandbox = BubblewrapSandbox(_workspace(work), None)
    try:
        sandbox.bind_read_only(cli.prefix, ClaudeCodeConfig.mount)
        executable = f"{ClaudeCodeConfig.mount}/{cli.relative_executable()}"
        run = sandbox.run([executable, "--version"], timeout=120, limits=cli_limits(sandbox.default_limits))
    finally:
        sandbox.close()
    assert run.outcome is Outcome.OK and cli.version in run.stdout, run
    return run.stdout.strip()


def vllm(work: Path) -> str:
    """VLLMServer's launch (its die-with-parent launcher exec'ing vLLM); stopped once vLLM's own process runs,
    long before it would be healthy."""
    from harnessrl.engine.vllm_server import MODULE, VLLMConfig, VLLMServer

    server = VLLMServer(VLLMConfig(work), log_path=work / "vllm.log")
    process = server.launch()
    try:
        _wait_exec(process, MODULE.encode(), server.log_tail)
    finally:
        server.stop(keep_log=True)
    return f"vLLM's server process {process.pid} ran {MODULE}"


def engine_serve(work: Path) -> str:
    """`harnessrl engine serve` (the embedded tiny model), until it listens."""
    command = [sys.executable, "-m", "harnessrl.cli", "engine", "serve", "--port", "0", "--threads", "1"]
    with open(work / "engine.log", "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
    finally:
        process.terminate()
        process.wait(60)
    assert "listening on" in line, f"{line!r}: {(work / 'engine.log').read_text()[-2000:]}"
    return line.strip()


def _pid() -> int:
    return os.getpid()


def ray(work: Path) -> str:
    """A local Ray cluster (its own processes), this process its driver, one task."""
    import ray as ray_api

    from harnessrl.rollout.ray_cluster import LocalRayCluster

    with LocalRayCluster(num_cpus=1) as cluster:
        cluster.connect()
        worker = ray_api.get(ray_api.remote(_pid).options(num_cpus=1).remote())
        assert worker in cluster.processes(), (worker, cluster.processes())
    return f"a Ray task ran in worker process {worker}"


def torchrun(work: Path) -> str:
    """Two ranks through harnessrl.train.launch (torchrun), each leaving a file."""
    from harnessrl.train.launch import run_ranks, torchrun_prefix

    script = 'echo "$RANK" > "$0/rank-$RANK"'
    run_ranks([*torchrun_prefix(2), "--no-python", "/bin/sh", "-c", script, str(work)], 2, timeout=300)
    ranks = sorted(p.name for p in work.glob("rank-*"))
    assert ranks == ["rank-0", "rank-1"], ranks
    return f"torchrun ranks left {ranks}"


def double(n: int) -> int:  # a kfp component: kfp reads its annotations as types (no `from __future__`)
    return 2 * n


def kfp_local(work: Path) -> str:
    """One step through kfp.local's SubprocessRunner, as `harnessrl run` runs a pipeline's steps."""
    from kfp import local

    from components.common import component

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(work / "kfp"))
    task = component(double)(n=21)
    assert task.output == 42, task.output
    return f"a kfp.local step returned {task.output}"


LAUNCHES: dict[str, Callable[[Path], str]] = {
    "bwrap": bwrap,
    "podman": podman,
    "cli_agent": cli_agent,
    "vllm": vllm,
    "engine_serve": engine_serve,
    "ray": ray,
    "torchrun": torchrun,
    "kfp_local": kfp_local,
}


def _libraries(binary: str) -> list[str]:
    """The shared libraries `binary` loads (ldd), loader included."""
    listed = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"(/\S+) \(0x", listed)


def probe_image() -> str:
    """An image of the host's sh (as /bin/sh) and sleep with their libraries, imported once (~0.2 s)."""
    from harnessrl.sandbox.images import image_exists

    if image_exists(PROBE_IMAGE):
        return PROBE_IMAGE
    programs = {
        "bin/sh": shutil.which("dash") or "/bin/sh",
        "bin/sleep": shutil.which("sleep") or "/bin/sleep",
    }
    files = {**programs, **{lib.lstrip("/"): lib for p in programs.values() for lib in _libraries(p)}}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("tmp", "workspace", "proc", "dev", "sys", "etc"):
            entry = tarfile.TarInfo(directory)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(entry)
        for inside, host in files.items():
            tar.add(str(Path(host).resolve()), arcname=inside)
    subprocess.run(
        ["podman", "import", "-", PROBE_IMAGE], input=buffer.getvalue(), capture_output=True, check=True
    )
    return PROBE_IMAGE


def _workspace(work: Path) -> Path:
    ws = work / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "README").write_text("a workspace\n")
    return ws


def _wait_exec(process: subprocess.Popen[bytes], program: bytes, log: Callable[[], str]) -> None:
    """Until `process` runs `program` (its launcher has exec'd it); fails if it exits first."""
    deadline = time.monotonic() + EXEC_WITHIN_S
    while True:
        try:
            if program in Path(f"/proc/{process.pid}/cmdline").read_bytes():
                return
        except OSError:
            pass
        code = process.poll()
        assert code is None, f"exited with {code} before running {program!r}:\n{log()}"
        assert time.monotonic() < deadline, f"did not run {program!r} within {EXEC_WITHIN_S:.0f} s:\n{log()}"
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    kind, work = argv[0], Path(argv[1])
    limit = memory_limit()
    total = int(limit * RESERVE_FACTOR)
    try:
        reserved = reserve(total, STEPS)
    except (OSError, ValueError, SystemError) as e:
        print(json.dumps({"skip": f"could not reserve {total / 2**30:.1f} GiB of address space: {e}"}))
        return 0
    refused = fork_refused(reserved, limit)
    report: dict[str, object] = {"reserved_gib": round(len(reserved) / 2**30, 1), "fork_refused": refused}
    if refused:
        report["started"] = LAUNCHES[kind](work)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
