"""Per-repo Python environments, created once and bound read-only into every sandbox of that repo.

    ensure_env(taskset: TaskSet, repo: str) -> Path

Offline by design: no package index is reachable from a training node's sandboxes (nor from this CI), so the
repo's dependencies and the test tools (pytest, ...) come from the Python environment harnessrl runs in. An env
is a `python -m venv --without-pip` venv with two path files:

- `00-harnessrl-host.pth`: the host environment's site-packages (read-only inside the sandbox);
- `zz-harnessrl-workspace.pth`: `/workspace` (and `/workspace/src` for src-layout repos) — the equivalent of
  an editable install of whatever tree is mounted at /workspace, so one env serves every task and every
  verification of the repo. The names sort so that installed packages always win over workspace files.

Cached under `<cache>/envs/<repo>-<hash>`, where the hash covers the Python version, the host site-packages and
the repo's packaging files (pyproject.toml, setup.py, setup.cfg, requirements*.txt on `main`). Creation is
serialized with a file lock and marked complete with `.ready`, so concurrent workers and reruns are safe.
A repo that needs compiled extensions or packages the host lacks must be built into the project image.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from harnessrl.sandbox.bwrap import ENV_MANIFEST
from harnessrl.sandbox.workspace import RepoCache, cache_root, git
from harnessrl.taskset import TaskSet

PACKAGING_FILES = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-test.txt",
    "test-requirements.txt",
)
REQUIRED_MODULES = ("pytest",)
BARE_ENV = "bare"


class EnvError(RuntimeError):
    """The repo's environment cannot be built here (infrastructure, never the agent)."""


def _host_site_dirs() -> list[str]:
    dirs = []
    for key in ("purelib", "platlib"):
        p = str(Path(sysconfig.get_paths()[key]).resolve())
        if p not in dirs:
            dirs.append(p)
    return dirs


def _tree_files(cache: RepoCache, rev: str) -> list[str]:
    out = git(["--git-dir", str(cache.path), "ls-tree", "--name-only", rev]).stdout.decode()
    return out.splitlines()


def env_key(cache: RepoCache, repo: str) -> tuple[str, bool]:
    main = cache.rev("refs/heads/main") if _has_ref(cache, "refs/heads/main") else cache.rev("HEAD")
    top = _tree_files(cache, main)
    h = hashlib.sha256()
    h.update(sys.version.encode())
    h.update("\0".join(_host_site_dirs()).encode())
    for name in PACKAGING_FILES:
        if name in top:
            h.update(name.encode() + b"\0")
            h.update(git(["--git-dir", str(cache.path), "show", f"{main}:{name}"]).stdout)
    return f"{repo.replace('/', '__')}-{h.hexdigest()[:12]}", "src" in top


def _has_ref(cache: RepoCache, ref: str) -> bool:
    return (
        git(["--git-dir", str(cache.path), "rev-parse", "-q", "--verify", ref], check=False).returncode == 0
    )


_ready: dict[tuple[str, str], Path] = {}  # (mirror, cache root) -> env, per process


def ensure_env(taskset: TaskSet, repo: str) -> Path:
    cache = RepoCache.for_repo(taskset, repo)
    known = _ready.get((str(cache.path), str(cache_root())))
    if known is not None and (known / ".ready").is_file():
        return known
    path = _ensure_env(cache, repo)
    _ready[(str(cache.path), str(cache_root()))] = path
    return path


def _ensure_env(cache: RepoCache, repo: str) -> Path:
    key, src_layout = env_key(cache, repo)

    def fill(path: Path) -> None:
        site = Path(
            subprocess.run(
                [
                    str(path / "bin" / "python"),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        host = _host_site_dirs()
        (site / "00-harnessrl-host.pth").write_text("".join(d + "\n" for d in host))
        workspace_paths = ["/workspace/src"] if src_layout else ["/workspace"]
        (site / "zz-harnessrl-workspace.pth").write_text("".join(p + "\n" for p in workspace_paths))
        (path / ENV_MANIFEST).write_text(
            json.dumps({"repo": repo, "ro_paths": host, "workspace_paths": workspace_paths}, indent=2)
        )
        for mod in REQUIRED_MODULES:
            check = subprocess.run(
                [str(path / "bin" / "python"), "-c", f"import {mod}"], capture_output=True, text=True
            )
            if check.returncode != 0:
                raise EnvError(
                    f"env {path}: `import {mod}` fails ({check.stderr.strip().splitlines()[-1:]}); "
                    f"install {mod} in the environment harnessrl runs in"
                )

    return cached_venv(key, fill)


def cached_venv(name: str, fill: Callable[[Path], None], root: Path | None = None) -> Path:
    """A `--without-pip` venv at `<root>/<name>` (default root: `<cache>/envs`), made once: `fill(env)` adds its
    path files and manifest before it is marked complete (`.ready`); a file lock makes concurrent workers and
    reruns safe."""
    env = (root or cache_root() / "envs") / name
    if (env / ".ready").exists():
        return env
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (env / ".ready").exists():
            return env
        shutil.rmtree(env, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(env)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise EnvError(f"creating venv {env} failed: {proc.stderr.strip()}")
        fill(env)
        (env / ".ready").write_text("ok\n")
    return env


def bare_env() -> Path:
    """The Python a scratch workspace's bubblewrap sandbox runs: the standard library only, nothing of the
    host's packages (an answer-graded task has no repository whose dependencies it would need)."""
    key = hashlib.sha256(sys.version.encode()).hexdigest()[:12]
    return cached_venv(f"{BARE_ENV}-{key}", lambda env: None)
