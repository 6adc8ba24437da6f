"""Sandboxes: workspace materialization, per-repo Python envs, and sandbox backends (bubblewrap, podman, Kubernetes).

Stable entry points (used by the rollout and verify stages):

    workspace.materialize(taskset, instance_id, dest, strict=False) -> Path
    envs.ensure_env(taskset, repo) -> Path
    base.Sandbox.run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult
    bwrap.BubblewrapSandbox(workspace, env_dir, gateway_socket=None, ...)
    backends.make_sandbox(kind, workspace, *, env_dir, image, limits, network=None) -> Sandbox
    kubernetes.KubernetesPodSandbox(workspace, image, limits, network=None), kubernetes.render_pod(...)
"""
