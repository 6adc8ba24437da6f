"""How harnessrl starts child processes: never by fork() of the starting process.

Owns the rule every launch in the product keeps, `die_with_parent` (the one way a launch ties a child's life
to the thread that starts it; `end_with_parent` for a child that another launcher, torchrun, starts) and
`free_ports` (ports for a server about to be launched).

Why: under the kernel's default overcommit heuristic (vm.overcommit_memory=0), fork() must commit a copy of
each of the caller's private writable mappings, and it is refused with ENOMEM when one is larger than RAM +
swap, which the (merged) anonymous memory of a process holding a model, an engine and torch's arenas reaches:
tens of GB of mostly untouched address space. `subprocess.Popen` (and what runs on it: asyncio's subprocesses,
kfp.local's steps, torchrun's ranks) uses vfork() or posix_spawn(), which copy nothing and are never refused,
unless it is given `preexec_fn`, `user`, `group` or `extra_groups`: those force CPython to fork(). So the
product starts children with a plain `subprocess.Popen` (`start_new_session`, `pass_fds`, `cwd`, `env` keep
vfork) and never with those four arguments, nor through `os.fork()`, multiprocessing's fork context,
`pty.fork()` or DataLoader workers. What must happen in the child before its program runs is done by an exec'd
launcher in front of the command: `die_with_parent` here, `setpriv --pdeathsig KILL` in the bubblewrap chain
(the same setpriv drops the sandbox's privileges). Ray's local cluster runs in processes of its own
(harnessrl.rollout.ray_cluster): its in-process start forks. A process that starts small may fork freely
(kernel grading's reference timer, forked by grade.py inside its sandbox): the refusal is about the size of
the forking process. tests/core/test_launch_under_memory_pressure.py starts every kind of child the product
starts from a process whose private memory exceeds the machine's RAM.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
from collections.abc import Mapping, Sequence

# Runs in the child in place of the command: asks for `sig` when the thread that started it exits
# (PR_SET_PDEATHSIG, kept across execve of a program that is not set-uid), then becomes the command.
# argv: sig, the starting process's pid, the program's path, the command's argv.
_LAUNCHER = """\
import ctypes, os, sys
sig, parent = int(sys.argv[1]), int(sys.argv[2])
if ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0) != 0:
    sys.exit("die_with_parent: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != parent:  # the parent ended before prctl: its signal will never come
    os.kill(os.getpid(), sig)
    sys.exit(128 + sig)
try:
    os.execv(sys.argv[3], sys.argv[4:])
except OSError as e:
    sys.exit(f"die_with_parent: cannot run {sys.argv[3]}: {e}")
"""


def die_with_parent(
    command: Sequence[str], env: Mapping[str, str] | None = None, sig: signal.Signals = signal.SIGTERM
) -> list[str]:
    """`command` behind an exec'd launcher (`python -I -S -c ...`) that makes the kernel send `sig` to it when
    the thread that starts it exits, as `preexec_fn` with prctl did, without fork(): start it with a plain
    `subprocess.Popen` (`env`: the environment it will get, whose PATH finds the program, as Popen's does).
    The process keeps the launcher's pid, so its process group and session are the command's. A program that
    cannot be found raises FileNotFoundError here, as Popen would. Not Linux: `command` unchanged."""
    if not command:
        raise ValueError("empty command")
    program = command[0]
    if not os.path.dirname(program):
        search = os.get_exec_path(dict(env) if env is not None else None)
        found = shutil.which(program, path=os.pathsep.join(search))
    else:  # a relative path is found from the child's cwd, as Popen's is
        found = None if os.path.isabs(program) and not os.path.exists(program) else program
    if found is None:
        raise FileNotFoundError(f"no such program: {program!r}")
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(int(sig)), str(os.getpid()), found, *command]


def end_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """Asks the kernel to send this process `sig` when its parent ends (Linux; elsewhere nothing). For a process
    started by a launcher that puts it in a session of its own, as torchrun does its ranks: killing the
    launcher's session (a lost node) would otherwise leave it running."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent == 1 or os.getppid() != parent:  # the parent ended before prctl: its signal will never come
        os.kill(os.getpid(), sig)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now (each held until all are picked, so none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
