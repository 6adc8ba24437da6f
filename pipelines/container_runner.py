"""`harnessrl run <pipeline> --runner container`: every step in the project image, through kfp.local's
DockerRunner talking to `podman system service` (podman's Docker-compatible API) on a Unix socket.

    with container_steps(arguments) as runner:   # a kfp.local.DockerRunner
        local.init(runner=runner, ...)

- The image is the one the components name (components.common.IMAGE), which `make image` tags locally; it is
  never pulled (no registry here): a missing image is a clear error naming `make image`.
- A step runs as the invoking user's uid:gid (the files it writes under the run directory stay the caller's),
  with no capabilities, no new privileges and the host's network (as a step of the subprocess runner has);
  absolute local paths among the pipeline's arguments (an imported source, localized s3 inputs) are bound
  read-only at the same path, the pipeline root read-write by kfp itself.
- `DOCKER_HOST` set by the caller wins; otherwise a `podman system service` is started for the run on a
  socket of its own and stopped after it.

The podman 4.3.1 quirk, worked around here and nowhere else: kfp starts each step with `auto_remove=True`,
then inspects it (docker-py's `containers.run`), streams its log and calls `wait()`. While podman removes
an exited step's container, it answers those calls with HTTP 500 "no such container" where Docker answers
404, so docker-py raises `APIError`, not the `NotFound` kfp catches: a step that exits quickly fails whatever
it did (measured here: 3 of 3 `exit 3` steps). With Docker kfp would instead assume exit code 0 for a
container it can no longer ask. For the duration of a container run `_run_step` replaces `kfp.local.docker_task_handler.
run_docker_container` (same signature): the container is not auto-removed, its log is followed, `wait()`
gives the real exit code, and then it is removed. (The same podman can also leave the log's follow request of
a container that exits at once unanswered: the log is then read once more after the exit, `_FollowedLog`.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipelines.run_inputs import LocalRunError

logger = logging.getLogger(__name__)

SERVICE_START_S = 60.0
LOG_DRAIN_S = 10.0  # after a step exits, for its followed log to end


@contextlib.contextmanager
def podman_service() -> Iterator[str]:
    """A Docker API endpoint (`unix://...`): $DOCKER_HOST, or a `podman system service` for this block."""
    if os.environ.get("DOCKER_HOST"):
        yield os.environ["DOCKER_HOST"]
        return
    with tempfile.TemporaryDirectory(prefix="harnessrl-podman-api-") as tmp:
        sock = Path(tmp) / "podman.sock"
        url = f"unix://{sock}"
        proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _wait_for_ping(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for_ping(url: str, proc: subprocess.Popen[bytes]) -> None:
    import docker

    deadline = time.monotonic() + SERVICE_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise LocalRunError(f"`podman system service` exited {proc.returncode}: {err[-500:]}")
        with contextlib.suppress(Exception):
            client = docker.DockerClient(base_url=url)
            try:
                if client.ping():
                    return
            finally:
                client.close()
        time.sleep(0.2)
    raise LocalRunError(f"`podman system service` did not answer on {url} within {SERVICE_START_S:g} s")


def local_paths(arguments: Mapping[str, Any]) -> list[str]:
    """Absolute paths among the arguments that exist here: bound read-only into every step."""
    return sorted(
        {v for v in arguments.values() if isinstance(v, str) and v.startswith("/") and Path(v).exists()}
    )


def _run_step(client: Any, image: str, command: list[str], volumes: dict[str, Any], **run_args: Any) -> int:
    """kfp's run_docker_container without auto-remove (see the module docstring); never pulls."""
    from docker.errors import APIError, ImageNotFound
    from kfp.local.docker_task_handler import add_latest_tag_if_not_present

    image = add_latest_tag_if_not_present(image)
    try:
        client.images.get(image)
    except ImageNotFound:
        raise LocalRunError(
            f"image {image} is not in the local podman store; build it with `make image`"
        ) from None
    run_args.pop("auto_remove", None)
    container = client.containers.run(
        image=image, command=command, detach=True, stdout=True, stderr=True, volumes=volumes, **run_args
    )
    print(f"step container {container.short_id} from {image}")
    log = _FollowedLog(container)
    try:
        code = int(container.wait()["StatusCode"])
        log.finish()
        return code
    finally:
        with contextlib.suppress(APIError):
            container.remove(force=True)


class _FollowedLog:
    """A step's log printed while it runs. podman 4.3 can leave a follow request on a container that exits at
    once unanswered (measured: a 60 s read timeout, the step failed): the exit code comes from `wait()`, and
    what the stream did not print by LOG_DRAIN_S after the exit is read once, without following."""

    def __init__(self, container: Any) -> None:
        self.container, self.printed, self.lock = container, 0, threading.Lock()
        self.abandoned = self.complete = False
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # a stream that failed is made up for by finish()
            for chunk in self.container.logs(stream=True, follow=True):
                with self.lock:
                    if self.abandoned:
                        return
                    print(chunk.decode(errors="replace"), end="")
                    self.printed += len(chunk)
            self.complete = True

    def finish(self) -> None:
        self.thread.join(LOG_DRAIN_S)
        with self.lock:
            self.abandoned = True
            if not self.complete:
                rest = self.container.logs(stdout=True, stderr=True)[self.printed :]
                print(rest.decode(errors="replace"), end="")


@contextlib.contextmanager
def _kfp_runs_steps_with(run_step: Any) -> Iterator[None]:
    from kfp.local import docker_task_handler

    original = docker_task_handler.run_docker_container
    docker_task_handler.run_docker_container = run_step
    try:
        yield
    finally:
        docker_task_handler.run_docker_container = original


@contextlib.contextmanager
def container_steps(arguments: Mapping[str, Any]) -> Iterator[Any]:
    """A kfp.local.DockerRunner for the pipeline's steps, with the podman API up for the block."""
    from docker.types import Mount
    from kfp import local

    from components.common import IMAGE
    from harnessrl.sandbox.images import image_exists, podman_problem

    problem = podman_problem()
    if problem is not None:
        raise LocalRunError(f"--runner container: {problem}")
    if not image_exists(IMAGE):
        raise LocalRunError(f"--runner container: the step image {IMAGE} is not built here; run `make image`")
    mounts = [Mount(p, p, type="bind", read_only=True) for p in local_paths(arguments)]
    runner = local.DockerRunner(
        user=f"{os.getuid()}:{os.getgid()}",
        network_mode="host",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mounts=mounts,
    )
    previous = os.environ.get("DOCKER_HOST")
    with podman_service() as url, _kfp_runs_steps_with(_run_step):
        os.environ["DOCKER_HOST"] = url
        try:
            yield runner
        finally:
            if previous is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = previous
