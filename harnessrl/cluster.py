"""Names the cluster pieces share, without kfp: pipeline steps run with kfp's minimal runtime import
(`_KFP_RUNTIME=true`), so library code that a step calls (the Kubernetes sandbox, the RayJob launcher) must not
import the pipeline SDK. `components.common` and `pipelines.k8s` re-export these."""

from __future__ import annotations

import os

IMAGE = os.environ.get("HARNESSRL_IMAGE", "ghcr.io/harnessrl/harnessrl:0.1.0")

GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}  # label set by NVIDIA GPU feature discovery
GPU_TOLERATIONS: tuple[dict, ...] = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)

S3_SECRET_NAME = os.environ.get("HARNESSRL_S3_SECRET", "harnessrl-s3")
S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
STORE_CONFIG_MAP = os.environ.get("HARNESSRL_STORE_CONFIGMAP", "harnessrl-store")
STORE_CONFIG_KEYS = {
    "HARNESSRL_S3_ENDPOINT": "HARNESSRL_S3_ENDPOINT",
    "HARNESSRL_S3_BUCKET": "HARNESSRL_S3_BUCKET",
    "HARNESSRL_S3_REGION": "HARNESSRL_S3_REGION",
}
