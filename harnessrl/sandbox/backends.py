"""One place that turns a `SandboxKind` into a sandbox, for the rollout and verify stages.

    make_sandbox(kind, workspace, *, env_dir, image, limits, network=None) -> Sandbox

- bubblewrap / bubblewrap-strict: `BubblewrapSandbox(workspace, env_dir)` (env_dir: the repo's venv from
  `envs.ensure_env`); no network at all, so `network` must be None.
- podman: `PodmanSandbox(workspace, image, limits, network)`, one container from the task's image.
- kubernetes: `KubernetesPodSandbox(workspace, image, limits, network)`, one pod from the task's image in the
  sandbox namespace (cluster access from the pod's service account or `$KUBECONFIG`).

`image` is the task's `image_name`; the container backends refuse to start without one. `network` names an
egress allow-list (a podman network / the `harnessrl.io/egress` label a NetworkPolicy selects); None = none.
`local` is not a sandbox (the rollout stage runs it unisolated on request) and is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harnessrl.choices import parse_choice
from harnessrl.sandbox.base import Limits, Sandbox
from harnessrl.schema import SandboxKind

CONTAINER_KINDS = frozenset({SandboxKind.PODMAN, SandboxKind.KUBERNETES})


def needs_env(kind: SandboxKind) -> bool:
    """Whether the backend runs the host-built per-repo venv (container backends bring the image's)."""
    return kind in (SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT)


def make_sandbox(
    kind: SandboxKind,
    workspace: Path,
    *,
    env_dir: Path | None,
    image: str | None,
    limits: Limits,
    network: str | None = None,
) -> Sandbox:
    if kind in (SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT):
        if network is not None:
            raise ValueError(
                f"sandbox {kind}: has no network (network={network!r}); use podman or kubernetes for an "
                "egress allow-list"
            )
        from harnessrl.sandbox.bwrap import BubblewrapSandbox

        return BubblewrapSandbox(workspace, env_dir, limits=limits)
    if kind not in CONTAINER_KINDS:
        raise ValueError(f"sandbox {kind!r} is not a sandbox backend (local runs unisolated, rollouts only)")
    if not image:
        raise ValueError(
            f"sandbox {kind}: no image for {workspace.name!r}; give the task an image_name "
            "(the build_environments stage records one) or use sandbox bubblewrap"
        )
    if kind is SandboxKind.PODMAN:
        try:
            from harnessrl.sandbox.podman import PodmanSandbox  # pyright: ignore[reportMissingImports]
        except ImportError as e:
            raise ValueError(
                f"sandbox podman is not available in this install ({e}); update harnessrl to a version "
                "with harnessrl/sandbox/podman.py or use sandbox bubblewrap"
            ) from None
        return PodmanSandbox(workspace, image, limits, network=network)
    from harnessrl.sandbox.kubernetes import KubernetesPodSandbox

    return KubernetesPodSandbox(workspace, image, limits, network=network)


@dataclass(frozen=True)
class SandboxChoice:
    """Where a stage runs its sandboxes: the backend and its egress allow-list (verify's `--sandbox`)."""

    kind: SandboxKind = SandboxKind.BUBBLEWRAP
    network: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_choice(SandboxKind, self.kind, "sandbox"))
        if self.kind is SandboxKind.LOCAL:
            raise ValueError("sandbox local is for debugging rollouts only; verify needs a sandbox backend")
        if self.network is not None and self.kind not in CONTAINER_KINDS:
            raise ValueError(f"sandbox {self.kind} has no network; --network needs podman or kubernetes")

    def make(self, workspace: Path, *, env_dir: Path | None, image: str | None, limits: Limits) -> Sandbox:
        return make_sandbox(
            self.kind, workspace, env_dir=env_dir, image=image, limits=limits, network=self.network
        )


DEFAULT_CHOICE = SandboxChoice()  # bubblewrap, no network
