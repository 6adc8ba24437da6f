"""Who sandboxed code is on the host: never root.

Run as root, each `BubblewrapSandbox` takes a host uid of its own, `uid_base() + slot`, held by an flock on
`/run/harnessrl/uids/<uid>.lock` for the sandbox's lifetime (released by the kernel if we die), and the
shared group `uid_base()`. The command chain drops to that uid and group (util-linux `setpriv`) *before*
bubblewrap builds its user namespace, so uid 1000 inside maps to an unprivileged host uid: writes to
/proc/sys and every other root-only file are refused by the kernel, capabilities inside the namespace count
for nothing outside it, and RLIMIT_NPROC binds that sandbox alone. Run as a normal user, sandboxes run as
that user (in their own user namespace), as before.

The range starts at 1_100_000_000 (far from real and subordinate ids); `HARNESSRL_SANDBOX_UID_BASE` moves it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.sandbox.base import SandboxError

DEFAULT_UID_BASE = 1_100_000_000
SLOTS = 65_536
LOCK_DIR = Path("/run/harnessrl/uids")


def uid_base() -> int:
    raw = os.environ.get("HARNESSRL_SANDBOX_UID_BASE", str(DEFAULT_UID_BASE))
    try:
        base = int(raw)
    except ValueError:
        raise SandboxError(f"HARNESSRL_SANDBOX_UID_BASE={raw!r} is not an integer") from None
    if not 1000 <= base <= 0xFFFFFFFE - SLOTS:
        raise SandboxError(
            f"HARNESSRL_SANDBOX_UID_BASE={base} must leave room for {SLOTS} uids between 1000 and 2**32-2"
        )
    return base


@dataclass
class HostIdentity:
    """The unprivileged host uid/gid a root-run sandbox drops to."""

    uid: int
    gid: int
    _lock_fd: int | None = field(default=None, repr=False)

    def setpriv_args(self) -> list[str]:
        return [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None


def _lock_dir() -> Path:
    try:
        LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(LOCK_DIR)
    except OSError as e:
        raise SandboxError(f"cannot create {LOCK_DIR} for sandbox uid locks: {e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{LOCK_DIR} must be a directory owned by uid {os.geteuid()} with mode 0700")
    return LOCK_DIR


def acquire() -> HostIdentity | None:
    """A free uid of the range, locked for the caller; None when not running as root (nothing to drop)."""
    if os.geteuid() != 0:
        return None
    base, d = uid_base(), _lock_dir()
    for slot in range(1, SLOTS):  # lowest free slot first: lock files stay as many as sandboxes at once
        uid = base + slot
        fd = os.open(d / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        return HostIdentity(uid, base, fd)
    raise SandboxError(f"all {SLOTS - 1} sandbox uids from {base + 1} are in use")


def let_group_connect(sock: Path, gid: int) -> None:
    """connect() needs write permission on the socket inode: give the sandboxes' shared group read-write."""
    st = sock.stat()
    if st.st_gid != gid or st.st_mode & 0o060 != 0o060:
        os.chown(sock, -1, gid)
        os.chmod(sock, (st.st_mode & 0o7777) | 0o060)
