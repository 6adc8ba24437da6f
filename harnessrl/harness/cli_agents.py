"""Production CLI agents as harnesses: where their pinned, unchanged builds live and how they get there.

`make cli-agents` (part of `make test`'s set-up) runs `python -m harnessrl.harness.cli_agents install`, which
`npm install`s each pinned CLI once into its own prefix, `$HARNESSRL_CACHE/cli/<name>-<version>/` (default
`~/.cache/harnessrl`): with `--ignore-scripts` (no vendor install script runs; the native executable is taken
from the platform package npm picked), into a temp dir renamed into place, so a prefix is whole or absent.
Nothing is downloaded when a rollout runs: a harness whose CLI is not installed ends the rollout as an
`infra_error` that says to run `make cli-agents`. Where npm cannot run (no npm, offline), the reason is kept in
`<prefix>.install-failed` and the tests that need the CLI skip with it.

Claude Code: `@anthropic-ai/claude-code` 2.1.197, the newest release whose package still accepts Node 20
(2.1.198 and later declare `node >= 22`; Debian's Node is 20). It is a native executable (~245 MB, Bun), so
Node itself is only needed to install it, never to run it.

Codex: `@openai/codex` 0.171.0, the newest release (it declares `node >= 16`). Its npm package is a Node wrapper
around a static native executable (Rust, musl; ~300 MB) in the platform package npm picked
(`@openai/codex-linux-x64` -> `vendor/x86_64-unknown-linux-musl/bin/codex`), which we run directly.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLAUDE_CODE = "claude-code"
CLAUDE_CODE_VERSION = "2.1.197"
CODEX = "codex"
CODEX_VERSION = "0.171.0"
# name -> (npm package, pinned version)
PINNED: dict[str, tuple[str, str]] = {
    CLAUDE_CODE: ("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION),
    CODEX: ("@openai/codex", CODEX_VERSION),
}
MANIFEST = "harnessrl-cli.json"
NPM_TIMEOUT_S = 900


class CliNotInstalled(RuntimeError):
    """The pinned CLI is not in its prefix (an infrastructure problem: `make cli-agents`)."""


@dataclass(frozen=True)
class CliInstall:
    name: str
    version: str
    prefix: Path  # bound read-only into sandboxes
    executable: Path  # inside `prefix`

    def relative_executable(self) -> str:
        return str(self.executable.relative_to(self.prefix))


def cache_root() -> Path:
    return Path(os.environ.get("HARNESSRL_CACHE", Path.home() / ".cache" / "harnessrl"))


def prefix_for(name: str, version: str | None = None) -> Path:
    version = version or PINNED[name][1]
    return cache_root() / "cli" / f"{name}-{version}"


def installed(name: str, version: str | None = None) -> CliInstall | None:
    """The install of `name` at `version` (default: the pinned one), or None."""
    prefix = prefix_for(name, version)
    try:
        manifest = json.loads((prefix / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    executable = prefix / manifest["executable"]
    if not os.access(executable, os.X_OK):
        return None
    return CliInstall(name, manifest["version"], prefix, executable)


def require(name: str, version: str | None = None) -> CliInstall:
    found = installed(name, version)
    if found is None:
        version = version or PINNED[name][1]
        why = failure_reason(name, version)
        raise CliNotInstalled(
            f"{name} {version} is not installed in {prefix_for(name, version)}: run `make cli-agents`"
            + (f" (last attempt: {why})" if why else "")
        )
    return found


def failure_reason(name: str, version: str | None = None) -> str:
    """Why the last install attempt failed ("" when none did)."""
    marker = Path(f"{prefix_for(name, version)}.install-failed")
    with contextlib.suppress(OSError):
        return marker.read_text().strip()
    return ""


def skip_reason(name: str) -> str | None:
    """For tests: None when the pinned CLI is installed, else one line saying why not."""
    if installed(name) is not None:
        return None
    version = PINNED[name][1]
    why = failure_reason(name) or "not installed"
    return f"{name} {version}: {why} (run `make cli-agents`)"


def _npm_platform_packages() -> list[str]:
    """The platform package names npm may have chosen for this machine (glibc first)."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if arch is None or sys.platform != "linux":
        return []
    return [f"linux-{arch}", f"linux-{arch}-musl"]


_TRIPLES = {"x64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}


def _native_executable(prefix: Path, package: str) -> Path:
    """The platform package's executable. Claude Code: the wrapper's postinstall would copy it over
    `bin/claude.exe`; we do not run vendor scripts, so we run the same file where npm put it. Codex: its Node
    wrapper (`bin/codex.js`) execs `vendor/<target triple>/bin/codex` of the platform package; so do we."""
    for suffix in _npm_platform_packages():
        root = prefix / "node_modules" / f"{package}-{suffix}"
        arch = suffix.split("-")[1]
        for candidate in (root / "claude", root / "vendor" / _TRIPLES.get(arch, "") / "bin" / "codex"):
            if candidate.is_file():
                return candidate
    raise CliNotInstalled(
        f"npm installed {package} without a native executable for {sys.platform}/{platform.machine()}"
    )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def install(name: str, version: str | None = None, npm: str | None = None) -> tuple[CliInstall, bool]:
    """Installs `name` (idempotent, safe against concurrent callers); returns the install and whether this
    call made it. Raises CliNotInstalled with the reason (also kept in `<prefix>.install-failed`)."""
    package, pinned = PINNED[name]
    version = version or pinned
    prefix = prefix_for(name, version)
    marker = Path(f"{prefix}.install-failed")
    with _lock(Path(f"{prefix}.lock")):
        found = installed(name, version)
        if found is not None:
            return found, False
        npm = npm or shutil.which("npm")
        try:
            if npm is None:
                raise CliNotInstalled("npm is not installed (apt-get install nodejs npm)")
            tmp = Path(tempfile.mkdtemp(prefix=f".{prefix.name}-", dir=prefix.parent))
            try:
                cmd = [npm, "install", "--prefix", str(tmp), "--ignore-scripts", "--no-audit", "--no-fund"]
                cmd += ["--no-save", "--omit=dev", "--loglevel=error", f"{package}@{version}"]
                t0 = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
                if proc.returncode != 0:
                    last = (
                        proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}"
                    ).splitlines()
                    raise CliNotInstalled(f"npm install {package}@{version} failed: {last[-1][:300]}")
                executable = _native_executable(tmp, package)
                check = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60)
                if check.returncode != 0 or version not in check.stdout:
                    raise CliNotInstalled(f"{executable.name} --version gave {check.stdout.strip()!r}")
                manifest = {
                    "name": name,
                    "package": package,
                    "version": version,
                    "executable": str(executable.relative_to(tmp)),
                    "install_s": round(time.monotonic() - t0, 1),
                    "bytes": sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()),
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
                tmp.chmod(0o755)
                shutil.rmtree(prefix, ignore_errors=True)
                tmp.rename(prefix)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        except subprocess.TimeoutExpired:
            marker.write_text(f"npm install {package}@{version} timed out after {NPM_TIMEOUT_S} s\n")
            raise CliNotInstalled(marker.read_text().strip()) from None
        except CliNotInstalled as e:
            marker.write_text(f"{e}\n")
            raise
        marker.unlink(missing_ok=True)
        found = installed(name, version)
        assert found is not None
        return found, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.harness.cli_agents", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser(
        "install", help="install the pinned CLIs (idempotent); exit 0 with a note if npm fails"
    )
    inst.add_argument("names", nargs="*", help=f"default: all of {sorted(PINNED)}")
    inst.add_argument("--strict", action="store_true", help="exit 1 when an install fails")
    sub.add_parser("where", help="print each pinned CLI's executable, or why it is missing")
    args = parser.parse_args(argv)
    failed = 0
    if args.cmd == "install":
        unknown = sorted(set(args.names) - set(PINNED))
        if unknown:
            parser.error(f"unknown CLI(s) {unknown}; known: {sorted(PINNED)}")
        for name in args.names or sorted(PINNED):
            try:
                found, made = install(name)
            except CliNotInstalled as e:
                failed += 1
                print(f"{name}: not installed ({e}); the tests that run it will be skipped")
                continue
            manifest = json.loads((found.prefix / MANIFEST).read_text())
            state = f"installed in {manifest['install_s']} s" if made else "already installed"
            print(f"{name} {found.version}: {state}, {manifest['bytes'] >> 20} MB in {found.prefix}")
        return 1 if failed and args.strict else 0
    for name in sorted(PINNED):
        found = installed(name)
        print(f"{name}: {found.executable if found else skip_reason(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
