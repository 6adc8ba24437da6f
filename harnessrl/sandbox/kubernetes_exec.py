"""Running one command in a pod through the exec API (the `kubernetes` client's websocket, `v4.channel.k8s.io`),
and moving a workspace in and out of a pod as a tarball over the same channel.

    exec_in_pod(core, pod, namespace, container, argv, *, stdin=None, deadline, max_output) -> ExecResult
    pack_workspace(root) -> bytes                       (tar.gz of a directory, for `tar -x` in the pod)
    unpack_workspace(data, root, max_bytes)             (replaces root's content; hostile archives refused)

Channel protocol: each websocket frame starts with a channel byte, 0 = stdin, 1 = stdout, 2 = stderr,
3 = the final `Status` JSON (`Success`, or `Failure` with reason `NonZeroExitCode` and the exit code in
`details.causes[reason=ExitCode].message`; any other failure means the exec itself did not run).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STDOUT, STDERR, STATUS = 1, 2, 3
STDIN_CHUNK = 1 << 20


class OutputTooLarge(Exception):
    """A stream that must arrive whole (a workspace tarball) went over its cap."""


class _Capped:
    """Keeps the first and last `limit // 2` bytes of a stream (like the bubblewrap backend's output)."""

    def __init__(self, limit: int, whole: bool = False) -> None:
        self.limit, self.whole = limit, whole
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        if self.whole:
            self.head += data
            if len(self.head) > self.limit:
                raise OutputTooLarge(f"over {self.limit} bytes")
            return
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        extra = len(self.tail) - self.limit // 2
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        return bytes(self.head) + f"\n[... {self.dropped} bytes dropped ...]\n".encode() + bytes(self.tail)


@dataclass
class ExecResult:
    exit_code: int | None  # None: the exec did not run or did not finish (see error / timed_out)
    stdout: bytes
    stderr: bytes
    error: str = ""  # why the exec itself failed (not the command)
    timed_out: bool = False  # the client gave up at `deadline`


def parse_status(raw: bytes) -> tuple[int | None, str]:
    """(exit code, error) from channel 3's Status object."""
    try:
        status = json.loads(raw.decode("utf-8", "replace"))
    except json.JSONDecodeError:
        return None, f"unreadable exec status {raw[:200]!r}"
    if status.get("status") == "Success":
        return 0, ""
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause["message"]), ""
                except (KeyError, ValueError):
                    break
    return None, f"exec failed: {status.get('reason') or ''} {status.get('message') or ''}".strip()


def exec_in_pod(
    core: Any,
    pod: str,
    namespace: str,
    container: str,
    argv: list[str],
    *,
    stdin: bytes | None = None,
    deadline: float,
    max_output: int,
    whole_stdout: bool = False,
) -> ExecResult:
    """Runs `argv` in the pod; stdout/stderr capped at `max_output` bytes (head + tail), or, with
    `whole_stdout`, stdout kept whole and OutputTooLarge past the cap. Gives up at `deadline` (monotonic)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream
    from kubernetes.stream.ws_client import _IgnoredIO

    try:
        ws = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=container,
            command=argv,
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )
    except ApiException as e:
        return ExecResult(None, b"", b"", f"exec could not start: {e.status} {e.reason}")
    ws._all = _IgnoredIO()  # the client also copies every output byte into one unbounded buffer: not here
    out, err, status = _Capped(max_output, whole_stdout), _Capped(max_output), bytearray()
    try:
        if stdin is not None:
            for i in range(0, len(stdin), STDIN_CHUNK):
                ws.write_stdin(stdin[i : i + STDIN_CHUNK])
        while ws.is_open():
            left = deadline - time.monotonic()
            if left <= 0:
                return ExecResult(None, out.value(), err.value(), "", timed_out=True)
            ws.update(timeout=min(left, 1.0))
            for channel, buf in ((STDOUT, out), (STDERR, err)):
                data = ws.read_channel(channel)
                if data:
                    buf.add(data)
        for channel, buf in ((STDOUT, out), (STDERR, err)):
            data = ws.read_channel(channel)
            if data:
                buf.add(data)
        status += ws.read_channel(STATUS) or b""
    except OutputTooLarge:
        raise
    except Exception as e:  # the websocket broke: the pod or the API server went away
        return ExecResult(None, out.value(), err.value(), f"exec stream broke: {type(e).__name__}: {e}")
    finally:
        ws.close()
    if not status:
        return ExecResult(None, out.value(), err.value(), "exec ended without a status (container gone?)")
    code, error = parse_status(bytes(status))
    return ExecResult(code, out.value(), err.value(), error)


def pack_workspace(root: Path) -> bytes:
    return pack_files({entry: root / entry for entry in sorted(os.listdir(root))})


def pack_files(members: dict[str, Path]) -> bytes:
    """A gzipped tar of these paths under these names (directories whole)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)
    return buf.getvalue()


def unpack_workspace(data: bytes, root: Path, max_bytes: int) -> None:
    """Replaces `root`'s content with the archive's. The archive comes from a hostile pod: tarfile's `data`
    filter refuses absolute paths, `..`, links out of the tree and device files; `max_bytes` caps the total
    size. The new tree is unpacked beside `root` first, so a refused archive leaves `root` as it was."""
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            total = 0
            members = []
            for m in tar:
                total += max(m.size, 0)
                if total > max_bytes:
                    raise OutputTooLarge(f"workspace archive unpacks to over {max_bytes} bytes")
                members.append(m)
            tar.extractall(staging, members=members, filter=_member_filter)
        for entry in os.listdir(root):
            path = root / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        for entry in os.listdir(staging):
            os.rename(staging / entry, root / entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's `data` filter (no absolute or `..` names, no links out, no devices, no set-id bits, no
    owners), except that a symlink may point anywhere: it is only a name in the diff, as in a bubblewrap
    workspace (the `tar` filter still refuses members reached through it)."""
    if member.issym():
        return tarfile.tar_filter(member, dest).replace(uid=None, gid=None, uname=None, gname=None)  # type: ignore[arg-type]
    return tarfile.data_filter(member, dest)


def fingerprint(root: Path) -> int:
    """Changes whenever an entry under `root` is added, removed, resized, retouched or re-moded."""
    items = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            items.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns, st.st_mode))
    return hash(tuple(items))
