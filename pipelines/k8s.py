"""Kubernetes placement for pipeline steps: GPU steps and the S3 credentials of steps that stream big objects.

Only names of Secrets/ConfigMaps go into the compiled YAML; their values stay in the cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from kfp import dsl, kubernetes

from harnessrl.cluster import (  # defined without kfp: library code run inside steps uses them too
    GPU_NODE_SELECTOR,
    GPU_TOLERATIONS,
    S3_SECRET_KEYS,
    S3_SECRET_NAME,
    STORE_CONFIG_KEYS,
    STORE_CONFIG_MAP,
)

__all__ = [
    "GPU_NODE_SELECTOR",
    "GPU_TOLERATIONS",
    "S3_SECRET_KEYS",
    "S3_SECRET_NAME",
    "STORE_CONFIG_KEYS",
    "STORE_CONFIG_MAP",
    "gpu_step",
    "use_s3_credentials",
]


def _ensure_container_spec_exists(self: dsl.PipelineTask) -> None:
    """kfp's check before each resource setting of a task, without its `inspect.stack()`: that reads the source
    of every frame and scans all loaded modules for each, ~0.1 s a call in a process holding torch and
    transformers, and a GPU step makes six (measured: importing pipelines.full and pipelines.rounds, which build
    their DAGs, after torch, transformers and harnessrl: 9.1 s with kfp's check, 0.1 s with this one). Same
    condition, same message."""
    if self.container_spec is None:
        raise ValueError(
            f"{sys._getframe(1).f_code.co_name} can only be used on single-step components, not pipelines used "
            "as components, or special components like importers."
        )


dsl.PipelineTask._ensure_container_spec_exists = _ensure_container_spec_exists  # pyright: ignore[reportAttributeAccessIssue]


def gpu_step(
    task: dsl.PipelineTask,
    gpus: int = 1,
    accelerator: str = "nvidia.com/gpu",
    *,
    cpu: str = "8",
    memory: str = "64G",
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping] | None = None,
) -> dsl.PipelineTask:
    """Requests `gpus` accelerators plus CPU/memory and pins the step to GPU nodes (selector + toleration).
    `gpus` may be a pipeline parameter: the count is then set when the run starts (KFP's `resourceCount`)."""
    if isinstance(gpus, int) and gpus < 1:
        raise ValueError(f"gpu_step: gpus must be >= 1, got {gpus}")
    task.set_accelerator_type(accelerator).set_accelerator_limit(gpus)
    task.set_cpu_request(cpu).set_cpu_limit(cpu).set_memory_request(memory).set_memory_limit(memory)
    for key, value in (GPU_NODE_SELECTOR if node_selector is None else node_selector).items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for tol in GPU_TOLERATIONS if tolerations is None else tolerations:
        kubernetes.add_toleration(task, **tol)
    return task


def use_s3_credentials(
    task: dsl.PipelineTask, secret_name: str = S3_SECRET_NAME, config_map: str = STORE_CONFIG_MAP
) -> dsl.PipelineTask:
    """Env for `harnessrl.store` from a Secret (keys) and a ConfigMap (endpoint, bucket); values never in YAML."""
    kubernetes.use_secret_as_env(task, secret_name=secret_name, secret_key_to_env=S3_SECRET_KEYS)
    kubernetes.use_config_map_as_env(
        task, config_map_name=config_map, config_map_key_to_env=STORE_CONFIG_KEYS
    )
    return task
