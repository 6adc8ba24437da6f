"""Container images with podman, built here with no registry and no network inside a build.

    podman_problem() -> str | None                   why podman cannot run containers here (None: it can)
    ensure_base() -> str                             BASE_IMAGE: Debian bookworm (debootstrap + podman import),
                                                     python3, venv, git; built once
    build_wheelhouse(targets) -> Path                build/wheelhouse: the project's wheels, pinned to the
                                                     versions installed here (constraints.txt)
    build_project(target="cpu") -> str               the project image (manifests/image/Dockerfile); tagged
                                                     also as components.common.IMAGE, which every step names
    ensure_env_image(taskset, repo) -> str           a task repo's environment image: the repo's dependencies
                                                     and pytest in /opt/env, `/workspace` on its path

Python packages enter images only from a wheelhouse made on the host (`pip wheel`, through whatever index
the host's pip uses); RUN steps run with `--network none`.

    python -m harnessrl.sandbox.images base|wheelhouse|project [--target cpu|full]
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from enum import StrEnum
from pathlib import Path

from harnessrl.sandbox.workspace import RepoCache, cache_root
from harnessrl.taskset import TaskSet

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "manifests" / "image" / "Dockerfile"
IGNOREFILE = REPO_ROOT / "manifests" / "image" / "containerignore"
WHEELHOUSE = REPO_ROOT / "build" / "wheelhouse"
CLI_CONTEXT = REPO_ROOT / "build" / "cli"  # the agent image's CLIs (stage_cli_agents)
BASE_IMAGE = "localhost/harnessrl-base:bookworm"
SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "git", "ca-certificates")
# what debootstrap leaves that no container needs (apt's downloads and lists, docs, man pages, locales)
PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")
ENV_IMAGE_PREFIX = "localhost/harnessrl-env"
ENV_LABEL = "org.harnessrl.env"
WORKSPACE_PTH = "zz-harnessrl-workspace.pth"


class ImageTarget(StrEnum):
    CPU = "cpu"  # core deps + pytest: data prep, verify, reports (what the tests build); stage deps-cpu
    FULL = "full"  # + the [local] extra: torch (CPU), transformers, ray; generate and train; deps-full


class ImageError(RuntimeError):
    """An image could not be built (infrastructure, never the agent's doing)."""


def podman(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ImageError(f"podman {' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@functools.cache
def podman_problem() -> str | None:
    """None when podman can run containers here, else why not (one line with the fix)."""
    if shutil.which("podman") is None:
        return "podman is not installed (`make sysdeps` as root installs podman and runc)"
    if os.geteuid() != 0:  # rootless podman maps uids differently: untested, so not used
        return "not running as root: harnessrl uses rootful podman (sandbox uids, cgroup limits)"
    try:
        info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    except subprocess.TimeoutExpired:
        return "`podman info` did not answer within 60 s"
    if info.returncode != 0:
        last = info.stderr.strip().splitlines()[-1:] or ["?"]
        return f"`podman info` fails: {last[0]}"
    return None


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def image_size_mb(name: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout.strip()) / 1e6


def apt_mirror() -> str:
    """The Debian archive apt uses here (debootstrap must reach the same one)."""
    sources = Path("/etc/apt")
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        for m in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text):
            uri = m.group(1).rstrip("/")
            if uri.endswith("/debian") and "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def _locked(name: str):
    root = cache_root() / "images"
    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / f"{name}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def ensure_base(force: bool = False) -> str:
    """BASE_IMAGE, built once: `debootstrap --variant=minbase` + python3/venv/git, pruned, `podman import`."""
    with _locked("base"):
        if not force and image_exists(BASE_IMAGE):
            return BASE_IMAGE
        if shutil.which("debootstrap") is None:
            raise ImageError("debootstrap is not installed (`make sysdeps` as root, or apt-get install it)")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="harnessrl-base-", dir="/var/tmp") as tmp:
            rootfs = Path(tmp) / "rootfs"
            proc = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(DEBIAN_PACKAGES)}",
                    SUITE,
                    str(rootfs),
                    apt_mirror(),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
                raise ImageError("debootstrap failed:\n" + "\n".join(tail))
            for rel in PRUNE:
                for child in (rootfs / rel).glob("*"):
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            archive = Path(tmp) / "rootfs.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(rootfs, arcname=".")
            podman(
                "import",
                "--change",
                "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8",
                "--change",
                'CMD ["/bin/bash"]',
                str(archive),
                BASE_IMAGE,
            )
        logger.info("built %s in %.0f s", BASE_IMAGE, time.monotonic() - started)
        return BASE_IMAGE


# -- the project image ---------------------------------------------------------------------------------
def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def requirements(target: ImageTarget) -> list[str]:
    project = _project()
    if target is ImageTarget.CPU:
        # pytest: data prep runs the source repo's suite; setuptools/wheel: the project's own build backend
        return [*project["dependencies"], "pytest", "setuptools>=77", "wheel"]
    return list(project["optional-dependencies"]["local"])


def constraints() -> str:
    """The versions installed in the environment running this (the ones the test suite ran with)."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    keep = [ln for ln in frozen.splitlines() if "==" in ln and " @ " not in ln and not ln.startswith("-")]
    return "".join(ln + "\n" for ln in sorted(keep) if not ln.lower().startswith("harnessrl=="))


def build_wheelhouse(targets: tuple[ImageTarget, ...] = (ImageTarget.CPU,), dest: Path = WHEELHOUSE) -> Path:
    """Wheels for `targets` in `dest` (requirements-<target>.txt, constraints.txt); skipped when unchanged."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = constraints()
    (dest / "constraints.txt").write_text(pins)
    for target in targets:
        reqs = "".join(r + "\n" for r in requirements(target))
        stamp = dest / f".built-{target}"
        key = hashlib.sha256((reqs + pins).encode()).hexdigest()
        (dest / f"requirements-{target}.txt").write_text(reqs)
        if stamp.is_file() and stamp.read_text() == key:
            continue
        started = time.monotonic()
        _pip_wheel(dest, dest / f"requirements-{target}.txt", f"the {target} image")
        stamp.write_text(key)
        logger.info("wheelhouse %s: built in %.0f s", target, time.monotonic() - started)
    return dest


def _pip_wheel(dest: Path, requirements_file: Path, what: str) -> None:
    """Wheels for `requirements_file` (and their deps) into `dest`, pinned by `dest`/constraints.txt."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check"),
            *("--wheel-dir", str(dest), "-c", str(dest / "constraints.txt"), "-r", str(requirements_file)),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ImageError(f"pip wheel for {what} failed:\n{proc.stderr.strip()[-2000:]}")


def project_tag(target: ImageTarget = ImageTarget.CPU) -> str:
    return f"localhost/harnessrl:{_project()['version']}-{target}"


def build_project(
    target: ImageTarget = ImageTarget.CPU, no_cache: bool = False, with_cli_agents: bool = False
) -> str:
    """The project image (podman's layer cache makes a rebuild of unchanged sources take seconds). The cpu
    image is also tagged as the image the pipeline's components name (harnessrl.cluster.IMAGE), so the
    container runner finds it locally. `with_cli_agents`: the agent image (Dockerfile stage `agents`: the
    pinned CLIs too, tagged `...-agents`), from this host's `make cli-agents` installs."""
    from harnessrl.cluster import IMAGE

    ensure_base()
    targets = (ImageTarget.CPU,) if target is ImageTarget.CPU else (ImageTarget.CPU, ImageTarget.FULL)
    build_wheelhouse(targets)
    tags = [project_tag(target)] + ([IMAGE] if target is ImageTarget.CPU else [])
    stage = "app"
    if with_cli_agents:
        stage_cli_agents(CLI_CONTEXT)
        tags, stage = [f"{t}-agents" for t in tags], "agents"
    args = ["build", "--network", "none", "--layers", "--ignorefile", str(IGNOREFILE), "--target", stage]
    args += ["--build-arg", f"BASE={BASE_IMAGE}", "--build-arg", f"DEPS=deps-{target}", "-f", str(DOCKERFILE)]
    if no_cache:
        args.append("--no-cache")
    for tag in tags:
        args += ["-t", tag]
    with _locked(f"project-{target}"):
        before = _image_id(tags[0])
        podman(*args, str(REPO_ROOT))
        if before and before != _image_id(tags[0]):  # the previous build, now untagged: drop it
            podman("rmi", before, check=False)
    return tags[0]


def stage_cli_agents(dest: Path) -> None:
    """Every pinned CLI's install prefix into `dest` (the agent image's build context), hard-linked where
    the file system allows (they are ~650 MB); a CLI not installed stops the build with how to install it."""
    from harnessrl.harness.cli_agents import PINNED, installed, skip_reason

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in sorted(PINNED):
        found = installed(name)
        if found is None:
            raise ImageError(f"the agent image needs {skip_reason(name)}")
        try:
            shutil.copytree(found.prefix, dest / found.prefix.name, copy_function=os.link, symlinks=True)
        except OSError:  # another file system: copy
            shutil.rmtree(dest / found.prefix.name, ignore_errors=True)
            shutil.copytree(found.prefix, dest / found.prefix.name, symlinks=True)


def _image_id(name: str) -> str | None:
    proc = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


# -- environment images for task repos -----------------------------------------------------------------
ENV_CONTAINERFILE = """\
FROM {base}
ENV VIRTUAL_ENV=/opt/env PATH=/opt/env/bin:/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \\
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/env
COPY wheels/requirements.txt /opt/env/harnessrl-requirements.txt
RUN --mount=type=bind,source=wheels,target=/wheels \\
    pip install -q --no-index --find-links /wheels -r /opt/env/harnessrl-requirements.txt \\
 && python -c "import pytest" \\
 && printf '%s\\n' {workspace_paths} > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/{pth}"
COPY repo /workspace
RUN echo 'agent:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd && echo 'agent:x:1000:' >> /etc/group \
 && chown -R 1000:1000 /workspace
LABEL {label}={labels}
USER 1000
WORKDIR /workspace
"""


def _repo_requirements(tree: Path, scratch: Path) -> list[str]:
    """The repo's declared dependencies (from its own built metadata and requirements*.txt) + pytest."""
    reqs = ["pytest"]
    if (tree / "pyproject.toml").is_file() or (tree / "setup.py").is_file():
        out = scratch / "self"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(tree)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ImageError(f"building {tree.name}'s metadata failed:\n{proc.stderr.strip()[-1500:]}")
        wheel = next(out.glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:") and "extra ==" not in line:
                    reqs.append(line.split(":", 1)[1].strip())
    for name in (
        "requirements.txt",
        "requirements-dev.txt",
        "requirements-test.txt",
        "test-requirements.txt",
    ):
        f = tree / name
        if f.is_file():
            reqs += [ln.strip() for ln in f.read_text().splitlines() if ln.strip() and ln[0] not in "#-"]
    return reqs


def env_image_name(repo: str, key: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", repo.lower().replace("/", "__")).strip(".-_") or "repo"
    return f"{ENV_IMAGE_PREFIX}-{slug}:{key[:12]}"


def ensure_env_image(taskset: TaskSet, repo: str) -> str:
    """The repo's environment image (its `main` tree at /workspace, deps + pytest in /opt/env, the mounted
    /workspace importable as an editable install would be), built once per repo commit and requirements."""
    cache = RepoCache.for_repo(taskset, repo)
    commit = cache.rev("refs/heads/main")
    base = ensure_base()
    with tempfile.TemporaryDirectory(prefix="harnessrl-envimg-", dir="/var/tmp") as tmp:
        ctx = Path(tmp)
        cache.export(commit, ctx / "repo")
        reqs = _repo_requirements(ctx / "repo", ctx / "scratch")
        pins = constraints()
        src = "src" if (ctx / "repo" / "src").is_dir() else ""
        workspace_paths = "/workspace/src" if src else "/workspace"
        labels = {"repo": repo, "commit": commit, "requirements": reqs}
        text = ENV_CONTAINERFILE.format(
            base=base,
            workspace_paths=workspace_paths,
            pth=WORKSPACE_PTH,
            label=ENV_LABEL,
            labels=json.dumps(json.dumps(labels, sort_keys=True)),
        )
        key = hashlib.sha256("\0".join([text, _image_id(base) or "", pins]).encode()).hexdigest()
        name = env_image_name(repo, key)
        with _locked(f"env-{key[:12]}"):
            if image_exists(name):
                return name
            wheels = ctx / "wheels"
            wheels.mkdir()
            (wheels / "requirements.txt").write_text("".join(r + "\n" for r in reqs))
            (wheels / "constraints.txt").write_text(pins)
            _pip_wheel(wheels, wheels / "requirements.txt", f"{repo}'s environment")
            (ctx / "Containerfile").write_text(text)
            started = time.monotonic()
            podman(
                "build",
                "--network",
                "none",
                "--layers",
                "-f",
                str(ctx / "Containerfile"),
                "-t",
                name,
                str(ctx),
            )
            logger.info("built %s for %s in %.0f s", name, repo, time.monotonic() - started)
        return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.sandbox.images", description=__doc__)
    parser.add_argument("what", choices=["base", "wheelhouse", "project", "check"])
    parser.add_argument("--target", choices=list(ImageTarget), default=ImageTarget.CPU)
    parser.add_argument("--no-cache", action="store_true", help="rebuild every layer of the project image")
    parser.add_argument(
        "--with-cli-agents",
        action="store_true",
        help="the agent image: the project image plus the pinned CLI agents (make cli-agents first)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    problem = podman_problem()
    if args.what == "check":
        print(problem or "podman can run containers here")
        return 0 if problem is None else 1
    if problem is not None and args.what != "wheelhouse":
        print(f"images: not built: {problem}", file=sys.stderr)
        return 1
    target = ImageTarget(args.target)
    started = time.monotonic()
    try:
        if args.what == "base":
            name = ensure_base()
        elif args.what == "wheelhouse":
            print(build_wheelhouse((ImageTarget.CPU,) if target is ImageTarget.CPU else tuple(ImageTarget)))
            return 0
        else:
            name = build_project(target, no_cache=args.no_cache, with_cli_agents=args.with_cli_agents)
    except ImageError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    print(f"{name}: {image_size_mb(name):.0f} MB, {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
