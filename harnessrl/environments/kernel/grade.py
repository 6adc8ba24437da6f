"""The kernel environment's grader: runs INSIDE the sandbox (stdlib + numpy only), prints one JSON line.

    python -I grade.py --dir DIR --seed-file DIR/.seed [--timing-size N] [--repeats R] [--max-repeats M]
                       [--group G] [--cases-per-size K] [--call-timeout S] [--import-timeout S]

DIR holds the candidate `solution.py` and a PRISTINE copy of the task (`reference.py`, `inputs.py`,
`task.json`) that the host-side driver (runner.py) put there; the agent's own copies of the reference, the
input generator or this grader never reach it, and neither does `gold.py`. This file imports nothing of
harnessrl: it is copied into the sandbox next to the candidate.

What it owns and the invariants it keeps:
- **The candidate runs in a process of its own** (`python -I -c <this file's text> --worker ...`, started
  after the grader has loaded the pristine reference and input generator into its own memory). Requests and
  replies cross a pair of pipes in a small safe codec (JSON header + raw numpy buffers, whitelisted dtypes;
  never pickle), so nothing the candidate sends can run code here. The worker's stdout/stderr go to
  /dev/null: the candidate cannot print this grader's result line.
- **The clock is the grader's**: a candidate call is timed from the first byte of the request written to
  the last byte of the reply read (`time.perf_counter` in this process); patching timers or builtins inside
  solution.py changes nothing here.
- **Outputs are checked on every call**, correctness and timing calls alike, against the outputs of the
  pristine reference computed in this process on the same inputs (the timing worker's too): a call that skips work, returns early (threads finishing later) or returns cached
  values is wrong. All inputs come from the pristine `inputs.generate(seed, size)` with seeds derived from
  the secret seed (read from the seed file, which is deleted before any candidate code runs); each timing
  repeat gets fresh inputs, so nothing can be memoized across repeats.
- **Candidate code runs only while it imports and inside its own timed windows**: this process is a child
  subreaper, so every
  process the candidate starts (threads, pools, double-forked daemons) stays its descendant; they are all
  SIGSTOPped between candidate calls (the reference is never timed while candidate code runs) and SIGKILLed
  before the result is printed. This process is made non-dumpable, so the candidate cannot read its memory
  (`/proc/<pid>/mem`, `environ`, `fd`).
- **Timing**: the reference is timed in a worker process of its own (forked from this one, with the pristine
  reference loaded, before any candidate code; non-dumpable; left out of the freezing), through the same
  pipes and codec as the
  candidate, so both pay the same transport. After one warm-up input, each sample is `group` fresh inputs,
  each run by both back to back (who goes first alternates, so drift cancels); the sample keeps each side's
  fastest (least disturbed by other load) and its ratio reference / candidate. speedup = median of `repeats`
  sample ratios. Noise guard: while their relative IQR exceeds `NOISE_IQR`, more samples are taken, up to
  `max_repeats` (not when even the lower quartile earns full speed credit: more samples could not change
  the reward); still noisy, the claim is capped at the lower quartile of the ratios (`noisy: true`). Before
  each reference call the nice value and CPU affinity of the grader and the timer are checked against
  their start: candidate code that changed them (to slow the reference) voids the speed claim. The grader
  and both workers are pinned to one CPU (the one the grader started on), so the reference and the
  candidate share whatever else loads it (without the pin, a worker that keeps waking on a busier CPU was
  measured 2x slower than its twin on a loaded 2-core host). The candidate runs single-core by default: a
  candidate that widens its own affinity can use more cores (parallelism is its own to claim).
- **Per-call timeouts**: max(`--call-timeout`, `timeout_factor` x the reference's time on that input); a call
  over it is killed with the whole candidate process tree and the worker restarted (at most `MAX_RESTARTS`).

Reward (printed with its parts): 0.05 x syntax_ok + 0.25 x imports_ok + 0.40 x pass_rate
+ 0.30 x min(speedup / 2, 1) x pass_rate, where speedup is 0 unless every timing call was correct. The
untouched starting solution (the reference itself, speedup ~1) therefore scores ~0.85; 2x faster and correct
scores 1.0. A missing file or a syntax error scores 0, a file that parses but does not import or lacks the
function 0.05, a wrong solution that imports 0.30.

The printed line carries the host's `nonce` from the seed file, so a line forged by candidate code (which
never learns the nonce) cannot pass for the result.
"""

from __future__ import annotations

import os

# One BLAS thread for the reference and (inherited) the candidate, before numpy loads: timings then compare
# code, not how many cores a BLAS call grabbed on a shared machine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import enum  # noqa: E402
import fcntl  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

GRADER_VERSION = "kernel-grade/1"
W_SYNTAX, W_IMPORTS, W_CORRECT, W_SPEED = 0.05, 0.25, 0.40, 0.30
FULL_SPEED_CREDIT_AT = 2.0  # speedup at which the speed part is full
NOISE_IQR = 0.25  # relative IQR of the paired ratios above which more pairs are timed
MAX_RESTARTS = 2
MAX_FRAME = 256 << 20
MAX_DEPTH = 64
_DTYPE_KINDS = "biufc"


class GradeStatus(enum.StrEnum):
    CORRECT = "correct"  # every correctness case passed
    INCORRECT = "incorrect"  # imported, but at least one case failed
    IMPORT_ERROR = "import_error"  # parses, but importing raised / timed out / no such function
    SYNTAX_ERROR = "syntax_error"
    MISSING = "missing"  # no solution.py
    INTERNAL_ERROR = "internal_error"  # the grader itself failed: infrastructure, never the candidate


class CaseOutcome(enum.StrEnum):
    PASS = "pass"
    WRONG = "wrong"  # returned, but not the reference's output
    ERROR = "error"  # raised
    TIMEOUT = "timeout"
    CRASHED = "crashed"  # the worker process died
    PROTOCOL = "protocol"  # unsupported output type, oversized or unsolicited reply
    NOT_RUN = "not_run"  # no worker left (restarts used up)


class WireError(ValueError):
    """A value that the codec does not carry, or a frame that is not well formed."""


# -- codec: JSON header + raw buffers, no pickle ---------------------------------------------------------
def encode(value: Any) -> bytes:
    """One frame: u64 total length, u32 header length, JSON header, then (u64 length, bytes) per buffer."""
    blobs: list[bytes] = []

    def enc(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"value nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, float)):
            return v  # JSON ints are exact at any size; floats round-trip (NaN and inf included)
        if isinstance(v, (list, tuple)):
            items = [enc(x, depth + 1) for x in v]
            return items if isinstance(v, list) else {"tuple": items}
        if isinstance(v, dict):
            return {"dict": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        if isinstance(v, (bytes, bytearray)):
            blobs.append(bytes(v))
            return {"bytes": len(blobs) - 1}
        if isinstance(v, (np.ndarray, np.generic, complex)):
            a = np.ascontiguousarray(np.asarray(v))
            if a.dtype.kind not in _DTYPE_KINDS or a.dtype.fields is not None:
                raise WireError(f"numpy dtype {a.dtype} is not carried (numeric and bool only)")
            blobs.append(a.tobytes())
            return {"nd": len(blobs) - 1, "dtype": a.dtype.newbyteorder("=").str, "shape": list(a.shape)}
        raise WireError(
            f"values of type {type(v).__name__} are not carried (numbers, str, list, tuple, "
            "dict, bytes, numpy arrays)"
        )

    header = json.dumps(enc(value, 0), separators=(",", ":")).encode()
    parts = [struct.pack("<I", len(header)), header]
    for b in blobs:
        parts += [struct.pack("<Q", len(b)), b]
    body = b"".join(parts)
    return struct.pack("<Q", len(body)) + body


def decode(body: bytes) -> Any:
    """The value of a frame's body (without its u64 length prefix); WireError on anything malformed."""
    try:
        (hlen,) = struct.unpack_from("<I", body, 0)
        header = json.loads(body[4 : 4 + hlen])
        blobs: list[bytes] = []
        pos = 4 + hlen
        while pos < len(body):
            (n,) = struct.unpack_from("<Q", body, pos)
            pos += 8
            if pos + n > len(body):
                raise WireError("buffer runs past the frame")
            blobs.append(body[pos : pos + n])
            pos += n
    except (struct.error, ValueError, RecursionError) as e:
        raise WireError(f"malformed frame: {e}") from None

    def dec(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"value nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if isinstance(v, dict) and len(v) >= 1:
            if "tuple" in v and len(v) == 1 and isinstance(v["tuple"], list):
                return tuple(dec(x, depth + 1) for x in v["tuple"])
            if "dict" in v and len(v) == 1 and isinstance(v["dict"], list):
                out: dict[Any, Any] = {}
                for pair in v["dict"]:
                    if not isinstance(pair, list) or len(pair) != 2:
                        raise WireError("bad dict entry")
                    key = dec(pair[0], depth + 1)
                    if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                        raise WireError("unhashable dict key")
                    out[key] = dec(pair[1], depth + 1)
                return out
            if "bytes" in v and len(v) == 1:
                return _blob(blobs, v["bytes"])
            if "nd" in v and set(v) == {"nd", "dtype", "shape"}:
                return _array(_blob(blobs, v["nd"]), v["dtype"], v["shape"])
        raise WireError(f"unknown header item {str(v)[:80]!r}")

    return dec(header, 0)


def _blob(blobs: list[bytes], index: Any) -> bytes:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(blobs):
        raise WireError("bad buffer index")
    return blobs[index]


def _array(buf: bytes, dtype: Any, shape: Any) -> np.ndarray:
    if not isinstance(dtype, str) or not isinstance(shape, list) or len(shape) > 32:
        raise WireError("bad array header")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError("bad array shape")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise WireError(f"bad dtype {dtype!r}") from None
    if dt.kind not in _DTYPE_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise WireError(f"dtype {dtype!r} is not carried")
    if math.prod(shape) * dt.itemsize != len(buf):
        raise WireError("array buffer size does not match its shape")
    return np.frombuffer(buf, dtype=dt).reshape(shape).copy()


# -- comparison ------------------------------------------------------------------------------------------
def same(expected: Any, got: Any, rtol: float, atol: float) -> bool:
    """Whether `got` equals the reference's `expected`: floats within rtol/atol (NaN == NaN), everything
    else exactly; a list/tuple and an array of the same numbers are the same."""
    if isinstance(expected, np.ndarray) or isinstance(got, np.ndarray):
        return _same_array(expected, got, rtol, atol)
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return False
        return all(same(e, g, rtol, atol) for e, g in zip(expected, got, strict=True))
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and set(got) == set(expected)
            and all(same(v, got[k], rtol, atol) for k, v in expected.items())
        )
    if isinstance(expected, bool) or expected is None or isinstance(expected, (str, bytes)):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, int):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and got == expected
    if isinstance(expected, (float, complex)):
        if not isinstance(got, (int, float, complex)) or isinstance(got, bool):
            return False
        if isinstance(expected, float) and isinstance(got, (int, float)) and math.isnan(expected):
            return math.isnan(got)
        return abs(got - expected) <= atol + rtol * abs(expected)
    return False


def _same_array(expected: Any, got: Any, rtol: float, atol: float) -> bool:
    try:
        e = np.asarray(expected)
        g = np.asarray(got)
    except (ValueError, TypeError):
        return False
    if e.shape != g.shape or e.dtype.kind not in _DTYPE_KINDS or g.dtype.kind not in _DTYPE_KINDS:
        return False
    if e.dtype.kind in "biu":
        return bool(np.array_equal(e, g))
    return bool(np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True))


# -- the candidate's process tree ------------------------------------------------------------------------
def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
# Processes freeze/thaw/kill_all leave alone: the reference worker (trusted, started before any candidate).
PROTECTED: set[int] = set()


def descendants() -> list[tuple[int, bytes]]:
    """(pid, state letter) of every live process below this one (a subreaper: orphans stay below),
    PROTECTED ones left out."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(name), fields[0]))
    out: list[tuple[int, bytes]] = []
    todo = [os.getpid()]
    while todo:
        for pid, state in children.get(todo.pop(), []):
            if pid not in PROTECTED:
                out.append((pid, state))
                todo.append(pid)
    return out


def _signal_all(sig: int, pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap() -> None:
    for pid, state in descendants():
        if state in (b"Z", b"X"):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def freeze() -> bool:
    """SIGSTOPs every (unprotected) descendant until all are stopped; False if they would not hold still."""
    for attempt in range(2000):
        running = [pid for pid, state in descendants() if state not in (b"T", b"t", b"Z", b"X")]
        if not running:
            return True
        _signal_all(signal.SIGSTOP, running)
        if attempt:
            time.sleep(0.0005)
    return False


def thaw() -> None:
    _signal_all(signal.SIGCONT, [pid for pid, _ in descendants()])


def kill_all() -> None:
    """SIGKILLs every (unprotected) descendant, repeatedly (one may fork meanwhile), and reaps them."""
    for _ in range(200):
        pids = [pid for pid, state in descendants() if state not in (b"Z", b"X")]
        if not pids:
            break
        _signal_all(signal.SIGKILL, pids)
        time.sleep(0.001)
        _reap()
    _reap()


def scheduling(pid: int) -> tuple[int, frozenset[int]]:
    """(nice value, CPU affinity) of a process: what candidate code could change to slow the reference."""
    return os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid))


def pin_to_current_cpu() -> int:
    """Restricts this process to the CPU it is running on (inherited by the workers); returns it."""
    allowed = os.sched_getaffinity(0)
    try:
        with open("/proc/self/stat", "rb") as f:
            cpu = int(f.read().rsplit(b")", 1)[1].split()[36])  # field 39, "processor"
    except (OSError, IndexError, ValueError):
        cpu = min(allowed)
    cpu = cpu if cpu in allowed else min(allowed)
    os.sched_setaffinity(0, {cpu})
    return cpu


def _big_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    try:  # fewer wake-ups per request: 1 MiB is the default ceiling for unprivileged processes
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass
    return r, w


@dataclass
class Reply:
    outcome: CaseOutcome
    value: Any = None
    seconds: float = 0.0
    detail: str = ""


class _Forked:
    """The handle of a forked child, with the part of Popen's interface Worker uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.returncode


class Worker:
    """One process answering one request per call: the candidate (`python -I -c <this file> --worker`,
    imports solution.py; its whole process tree runs only between thaw and freeze, inside the call's timed
    window) or the reference timer (forked from this process before any candidate exists, so it holds the
    pristine reference already loaded and inherits non-dumpability; PROTECTED from freezing)."""

    def __init__(
        self,
        source: str,
        module: Path,
        function: str,
        import_timeout: float,
        *,
        reference_fn: Callable[..., Any] | None = None,
    ) -> None:
        self.reference = reference_fn is not None
        req_r, self.req_w = _big_pipe()
        self.rep_r, rep_w = _big_pipe()
        self.proc: subprocess.Popen[bytes] | _Forked
        if reference_fn is not None:
            pid = os.fork()
            if pid == 0:  # the timer: never returns
                _serve_forked(req_r, rep_w, (self.req_w, self.rep_r), reference_fn)
            self.proc = _Forked(pid)
            PROTECTED.add(pid)
        else:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-c",
                    source,
                    "--worker",
                    str(req_r),
                    str(rep_w),
                    str(module),
                    function,
                ],
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        os.close(req_r)
        os.close(rep_w)
        os.set_blocking(self.req_w, False)
        os.set_blocking(self.rep_r, False)
        self.alive = True
        ready = self._exchange(b"", time.perf_counter() + import_timeout, 1 << 20, fresh=False)
        what = module.name
        if ready.outcome is CaseOutcome.TIMEOUT:
            self.import_error = f"importing {what} took over {import_timeout:g} s"
        elif ready.outcome is not CaseOutcome.PASS:
            self.import_error = ready.detail or f"the worker died while importing {what}"
        elif isinstance(ready.value, dict) and ready.value.get("ready") is True:
            self.import_error = ""
        elif isinstance(ready.value, dict) and isinstance(ready.value.get("import_error"), str):
            self.import_error = ready.value["import_error"][-2000:]
        else:
            self.import_error = "the worker sent something other than its ready message"
        if self.import_error:
            self.stop()
        elif not self.reference and not freeze():
            self.import_error = f"{what} started processes that could not be stopped"
            self.stop()

    def call(self, request: bytes, timeout: float, max_reply: int) -> Reply:
        """Sends one request frame and waits for the reply: (outcome, decoded value, seconds)."""
        if not self.alive:
            return Reply(CaseOutcome.NOT_RUN, detail="no worker")
        if self.reference:
            _signal_all(signal.SIGCONT, [self.proc.pid])  # in case candidate code stopped it
        else:
            thaw()
        reply = self._exchange(request, time.perf_counter() + timeout, max_reply)
        if reply.outcome in (CaseOutcome.TIMEOUT, CaseOutcome.CRASHED, CaseOutcome.PROTOCOL):
            self.stop()
            return reply
        if not self.reference and not freeze():
            self.stop()
            return Reply(CaseOutcome.PROTOCOL, detail="candidate processes could not be stopped")
        value = reply.value
        if isinstance(value, dict) and "ok" in value and len(value) == 1:
            return Reply(CaseOutcome.PASS, value["ok"], reply.seconds)
        if isinstance(value, dict) and isinstance(value.get("error"), str):
            return Reply(CaseOutcome.ERROR, seconds=reply.seconds, detail=value["error"][-1000:])
        return Reply(CaseOutcome.PROTOCOL, detail="reply is not {ok: value} or {error: text}")

    def _exchange(self, request: bytes, deadline: float, max_reply: int, fresh: bool = True) -> Reply:
        # Anything already waiting was sent before the request: it cannot be an answer to it.
        if fresh and select.select([self.rep_r], [], [], 0)[0]:
            return Reply(CaseOutcome.PROTOCOL, detail="the worker sent data nobody asked for")
        buf = bytearray()
        need = 8
        sent = 0
        started = time.perf_counter()
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return Reply(CaseOutcome.TIMEOUT, detail="call timed out")
            writers = [self.req_w] if sent < len(request) else []
            readable, writable, _ = select.select([self.rep_r], writers, [], remaining)
            if writable:
                try:
                    sent += os.write(self.req_w, request[sent : sent + (1 << 20)])
                except BrokenPipeError:
                    return Reply(CaseOutcome.CRASHED, detail="the worker closed its input")
            if readable:
                chunk = os.read(self.rep_r, 1 << 20)
                if not chunk:
                    code = self.proc.poll()
                    return Reply(CaseOutcome.CRASHED, detail=f"the worker exited (status {code})")
                buf += chunk
                if len(buf) >= 8 and need == 8:
                    (n,) = struct.unpack_from("<Q", buf, 0)
                    if n > max_reply:
                        return Reply(CaseOutcome.PROTOCOL, detail=f"reply of {n} bytes is over {max_reply}")
                    need = 8 + n
                if len(buf) >= need and need > 8:
                    break
        seconds = time.perf_counter() - started
        if sent < len(request) or len(buf) > need:
            return Reply(CaseOutcome.PROTOCOL, detail="reply before the whole request / trailing bytes")
        try:
            return Reply(CaseOutcome.PASS, decode(bytes(buf[8:need])), seconds)
        except WireError as e:
            return Reply(CaseOutcome.PROTOCOL, detail=str(e))

    def stop(self) -> None:
        if self.alive:
            self.alive = False
            for fd in (self.req_w, self.rep_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self.reference:
            _signal_all(signal.SIGKILL, [self.proc.pid])
            PROTECTED.discard(self.proc.pid)
        else:
            kill_all()
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass


def worker_main(req_fd: int, rep_fd: int, module_path: str, function: str) -> None:
    """The candidate's process (this file's text given to `python -I -c`): import, then serve."""
    try:
        spec = importlib.util.spec_from_file_location("solution", module_path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {module_path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["solution"] = module
        spec.loader.exec_module(module)
        fn = getattr(module, function, None)
        if not callable(fn):
            _send(rep_fd, {"import_error": f"{Path(module_path).name} defines no function {function!r}"})
            return
    except BaseException:
        _send(rep_fd, {"import_error": traceback.format_exc(limit=-3)})
        return
    _send(rep_fd, {"ready": True})
    serve(req_fd, rep_fd, fn)


def serve(req_fd: int, rep_fd: int, fn: Callable[..., Any]) -> None:
    """One reply frame per request frame until the request pipe closes."""
    while True:
        head = _read_exact(req_fd, 8)
        body = _read_exact(req_fd, struct.unpack("<Q", head)[0]) if head is not None else None
        if body is None:
            return
        try:
            out = encode({"ok": fn(*decode(body))})
        except BaseException as e:
            out = encode({"error": f"{type(e).__name__}: {e}"[:1000]})
        _write_all(rep_fd, out)


def _serve_forked(req_fd: int, rep_fd: int, parent_fds: tuple[int, int], fn: Callable[..., Any]) -> None:
    """The forked reference timer: drops the grader's ends of its pipes and its stdio, serves, exits."""
    code = 0
    try:
        for fd in parent_fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.setsid()
        _send(rep_fd, {"ready": True})
        serve(req_fd, rep_fd, fn)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _send(fd: int, value: Any) -> None:
    _write_all(fd, encode(value))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


# -- the task --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    name: str
    function: str
    correctness_sizes: list[int]
    timing_size: int
    rtol: float
    atol: float
    timeout_factor: float


def load_spec(directory: Path) -> TaskSpec:
    raw = json.loads((directory / "task.json").read_text())
    return TaskSpec(
        name=str(raw["name"]),
        function=str(raw["function"]),
        correctness_sizes=[int(s) for s in raw["correctness_sizes"]],
        timing_size=int(raw["timing_size"]),
        rtol=float(raw.get("rtol", 0.0)),
        atol=float(raw.get("atol", 0.0)),
        timeout_factor=float(raw.get("timeout_factor", 20.0)),
    )


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def derive_seed(seed: int, purpose: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{purpose}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Case:
    size: int
    outcome: CaseOutcome = CaseOutcome.NOT_RUN
    detail: str = ""


@dataclass
class Timing:
    ok: bool = False
    size: int = 0
    pairs: int = 0
    candidate_s: float | None = None  # medians
    reference_s: float | None = None
    ratio_iqr_rel: float | None = None
    noisy: bool = False
    cpu: int = -1  # the CPU the grader and both workers were pinned to
    ratios: list[float] = field(default_factory=list)  # reference / candidate per pair, sorted
    detail: str = ""


@dataclass
class Result:
    task: str
    nonce: str
    status: GradeStatus = GradeStatus.INTERNAL_ERROR
    syntax_ok: bool = False
    imports_ok: bool = False
    tests_passed: int = 0
    tests_total: int = 0
    pass_rate: float = 0.0
    speedup: float = 0.0
    candidate_s: float | None = None
    reference_s: float | None = None
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)
    failures: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""
    wall_s: float = 0.0
    grader: str = GRADER_VERSION

    def finish(self) -> None:
        parts = {
            "syntax": W_SYNTAX * self.syntax_ok,
            "imports": W_IMPORTS * self.imports_ok,
            "correctness": W_CORRECT * self.pass_rate,
            "speed": W_SPEED * min(self.speedup / FULL_SPEED_CREDIT_AT, 1.0) * self.pass_rate,
        }
        self.reward_parts = {k: round(v, 6) for k, v in parts.items()}
        self.reward = round(sum(parts.values()), 6)


class Reference:
    """The pristine reference in this process: the expected outputs (and, for timeouts, its time)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def run(self, request: bytes) -> tuple[Any, float, int]:
        """(decoded output, seconds, reply size) for one request frame, through the codec like a worker."""
        started = time.perf_counter()
        reply = encode({"ok": self.fn(*decode(request[8:]))})
        seconds = time.perf_counter() - started
        return decode(reply[8:])["ok"], seconds, len(reply)


class Grading:
    """One grade: the trusted reference (in this process and as a timing worker) and the candidate worker."""

    def __init__(self, args: argparse.Namespace, nonce: str, seed: int) -> None:
        self.args = args
        self.seed = seed
        self.directory = Path(args.dir)
        self.spec = load_spec(self.directory)
        self.result = Result(task=self.spec.name, nonce=nonce)
        # Everything trusted is loaded before any candidate code runs.
        self.source = Path(__file__).read_text()
        self.reference = Reference(
            getattr(load_module(self.directory / "reference.py", "_reference"), self.spec.function)
        )
        self.generate: Callable[[int, int], Any] = load_module(
            self.directory / "inputs.py", "_inputs"
        ).generate
        self.solution = self.directory / "solution.py"
        self.restarts = 0
        self.candidate: Worker | None = None
        self.timer: Worker | None = None
        # One CPU for this process and (inherited) both workers: the reference and the candidate then share
        # whatever else loads that CPU, instead of each waking wherever it last ran.
        self.cpu = pin_to_current_cpu()
        self.baseline = {os.getpid(): scheduling(os.getpid())}

    def run(self) -> Result:
        result, spec = self.result, self.spec
        if not self.solution.is_file():
            result.status, result.detail = GradeStatus.MISSING, "no solution.py"
            return result
        try:
            compile(self.solution.read_bytes(), "solution.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            result.status, result.detail = GradeStatus.SYNTAX_ERROR, f"{type(e).__name__}: {e}"[:500]
            return result
        result.syntax_ok = True
        self.timer = Worker(
            self.source, self.directory / "reference.py", spec.function, 60.0, reference_fn=self.reference.fn
        )
        if self.timer.import_error:
            raise RuntimeError(f"the reference timing worker did not start: {self.timer.import_error}")
        self.baseline[self.timer.proc.pid] = scheduling(self.timer.proc.pid)
        self.candidate = self._start_candidate()
        if self.candidate.import_error:
            result.status, result.detail = GradeStatus.IMPORT_ERROR, self.candidate.import_error
            return result
        result.imports_ok = True

        cases = [Case(size) for size in spec.correctness_sizes for _ in range(self.args.cases_per_size)]
        for i, case in enumerate(cases):
            request = encode(tuple(self.generate(derive_seed(self.seed, "correctness", i), case.size)))
            expected, ref_s, ref_len = self.reference.run(request)
            reply = self.call_candidate(request, ref_s, ref_len)
            case.outcome, case.detail = reply.outcome, reply.detail
            if reply.outcome is CaseOutcome.PASS and not same(expected, reply.value, spec.rtol, spec.atol):
                case.outcome, case.detail = CaseOutcome.WRONG, _describe(expected, reply.value)
        result.tests_total = len(cases)
        result.tests_passed = sum(c.outcome is CaseOutcome.PASS for c in cases)
        result.pass_rate = result.tests_passed / len(cases) if cases else 0.0
        result.failures = [
            {"size": c.size, "outcome": c.outcome.value, "detail": c.detail[:300]}
            for c in cases
            if c.outcome is not CaseOutcome.PASS
        ][:10]
        result.status = GradeStatus.CORRECT if result.tests_passed == len(cases) else GradeStatus.INCORRECT
        if result.pass_rate > 0:
            result.timing = self.time_pairs()
            if result.timing.ok:
                result.candidate_s = result.timing.candidate_s
                result.reference_s = result.timing.reference_s
                result.speedup = _speedup(result.timing)
        return result

    def _start_candidate(self) -> Worker:
        return Worker(self.source, self.solution, self.spec.function, self.args.import_timeout)

    def call_candidate(self, request: bytes, ref_seconds: float, ref_reply: int) -> Reply:
        if self.candidate is not None and not self.candidate.alive and self.restarts < MAX_RESTARTS:
            self.restarts += 1
            self.candidate = self._start_candidate()
        assert self.candidate is not None
        timeout = max(self.args.call_timeout, self.spec.timeout_factor * ref_seconds)
        return self.candidate.call(request, timeout, max(1 << 20, 16 * ref_reply))

    def call_timer(self, request: bytes, ref_seconds: float) -> Reply:
        """The reference's timed call, through the same pipes and codec as the candidate's. Candidate code is
        frozen meanwhile; its scheduling of this process and of the timer is checked first."""
        assert self.timer is not None
        tampered = [pid for pid, base in self.baseline.items() if _scheduling_or_none(pid) != base]
        if tampered:
            return Reply(
                CaseOutcome.PROTOCOL,
                detail=f"candidate code changed the nice value or CPU affinity "
                f"of the grader's processes {tampered}",
            )
        return self.timer.call(request, max(60.0, 10 * ref_seconds), 1 << 30)

    def time_pairs(self) -> Timing:
        """Repeats of one sample each: `group` fresh inputs, each run by the reference timer and the candidate
        back to back (who goes first alternates, so drift cancels); a sample is the fastest of the group on
        each side (the least disturbed by other load on the machine), its ratio reference / candidate."""
        args, spec = self.args, self.spec
        size = args.timing_size or spec.timing_size
        timing = Timing(size=size, cpu=self.cpu)
        cand: list[float] = []
        ref: list[float] = []
        index = 0
        group_cand: list[float] = []
        group_ref: list[float] = []
        while True:
            request = encode(tuple(self.generate(derive_seed(self.seed, "timing", index), size)))
            expected, ref_s, ref_len = self.reference.run(request)
            if index % 2:
                c = self.call_candidate(request, ref_s, ref_len)
                r = self.call_timer(request, ref_s)
            else:
                r = self.call_timer(request, ref_s)
                c = self.call_candidate(request, ref_s, ref_len)
            if r.outcome is not CaseOutcome.PASS or not same(expected, r.value, spec.rtol, spec.atol):
                timing.detail = f"reference timing call {index} failed ({r.outcome.value}): {r.detail}"[:300]
                return timing
            if c.outcome is not CaseOutcome.PASS or not same(expected, c.value, spec.rtol, spec.atol):
                detail = c.detail if c.outcome is not CaseOutcome.PASS else _describe(expected, c.value)
                timing.detail = f"timing call {index} ({c.outcome.value}): {detail}"[:300]
                return timing
            index += 1
            if index == 1:
                continue  # the warm-up
            group_cand.append(max(c.seconds, 1e-7))
            group_ref.append(max(r.seconds, 1e-7))
            if len(group_cand) < args.group:
                continue
            cand.append(min(group_cand))
            ref.append(min(group_ref))
            group_cand, group_ref = [], []
            if len(cand) < args.repeats:
                continue
            ratios = sorted(r_ / c_ for r_, c_ in zip(ref, cand, strict=True))
            iqr_rel = (_quantile(ratios, 0.75) - _quantile(ratios, 0.25)) / _quantile(ratios, 0.5)
            # more samples cannot change the reward once even the noisy claim earns full speed credit
            saturated = _quantile(ratios, 0.25) >= FULL_SPEED_CREDIT_AT
            if iqr_rel <= NOISE_IQR or saturated or len(cand) >= args.max_repeats:
                timing.ok = True
                timing.pairs = len(cand)
                timing.candidate_s = round(_quantile(sorted(cand), 0.5), 7)
                timing.reference_s = round(_quantile(sorted(ref), 0.5), 7)
                timing.ratio_iqr_rel = round(iqr_rel, 4)
                timing.noisy = iqr_rel > NOISE_IQR
                timing.ratios = [round(x, 4) for x in ratios]
                return timing

    def close(self) -> None:
        for worker in (self.candidate, self.timer):
            if worker is not None:
                worker.stop()


def _scheduling_or_none(pid: int) -> tuple[int, frozenset[int]] | None:
    try:
        return scheduling(pid)
    except OSError:
        return None


def _speedup(timing: Timing) -> float:
    """Median of the paired ratios; the lower quartile when the pairs stayed noisy."""
    if not timing.ratios:
        return 0.0
    return round(_quantile(timing.ratios, 0.25 if timing.noisy else 0.5), 4)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted list."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _describe(expected: Any, got: Any) -> str:
    def short(v: Any) -> str:
        if isinstance(v, np.ndarray):
            return f"array{v.shape} {v.dtype} {np.array2string(v.ravel()[:5], precision=6)}"
        return repr(v)[:120]

    return f"expected {short(expected)}, got {short(got)}"


def _read_secret(path: Path) -> tuple[int, str]:
    """The seed file `{"seed": int, "nonce": str}`, deleted once read (before any candidate code runs)."""
    raw = json.loads(path.read_text())
    try:
        path.unlink()
    except OSError:
        pass
    return int(raw["seed"]), str(raw.get("nonce", ""))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        req_fd, rep_fd, module, function = argv[1:5]
        worker_main(int(req_fd), int(rep_fd), module, function)
        return 0
    parser = argparse.ArgumentParser(description="Grade a kernel task's solution.py (run inside a sandbox).")
    parser.add_argument("--dir", required=True, help="holds solution.py and the pristine task files")
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument("--seed-file", help='JSON {"seed": N, "nonce": "..."}; deleted once read')
    secret.add_argument("--seed", type=int, help="for manual runs: visible to every process in the sandbox")
    parser.add_argument("--timing-size", type=int, default=0, help="overrides task.json's timing_size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-repeats", type=int, default=15)
    parser.add_argument(
        "--group", type=int, default=3, help="fresh inputs per timing sample (fastest counts)"
    )
    parser.add_argument("--cases-per-size", type=int, default=2)
    parser.add_argument("--call-timeout", type=float, default=2.0, help="floor of every call's timeout (s)")
    parser.add_argument("--import-timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    seed, nonce = (args.seed, "") if args.seed is not None else _read_secret(Path(args.seed_file))
    hardened = _prctl(PR_SET_DUMPABLE, 0) and _prctl(PR_SET_CHILD_SUBREAPER, 1)
    grading: Grading | None = None
    try:
        if not hardened:
            raise RuntimeError("prctl(PR_SET_DUMPABLE / PR_SET_CHILD_SUBREAPER) failed: not Linux?")
        grading = Grading(args, nonce, seed)
        result = grading.run()
        result.finish()
    except Exception:
        result = Result(task=Path(args.dir).name, nonce=nonce, detail=traceback.format_exc(limit=-4)[-2000:])
    if grading is not None:
        grading.close()
    PROTECTED.clear()
    kill_all()
    result.wall_s = round(time.perf_counter() - started, 4)
    print(json.dumps(asdict(result), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
