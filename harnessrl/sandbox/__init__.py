"""Sandboxes: workspace materialization, per-repo Python envs, and sandbox backends (bubblewrap, Kubernetes).

Stable entry points (used by the rollout and verify stages):

    workspace.materialize(taskset, instance_id, dest, strict=False) -> Path
    envs.ensure_env(taskset, repo) -> Path
    base.Sandbox.run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult
    bwrap.BubblewrapSandbox(workspace, env_dir, gateway_socket=None, ...)
    kubernetes.KubernetesSandbox(...), kubernetes.render_job(...), kubernetes.render_network_policy(...)
"""
