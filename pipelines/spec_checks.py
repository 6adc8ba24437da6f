"""Reads compiled pipeline YAML (KFP IR) and checks what matters on a cluster: GPU placement of GPU steps and
that credentials come from Secrets. Used by tests and by `harnessrl compile --check`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.k8s import GPU_NODE_SELECTOR, GPU_TOLERATIONS, S3_SECRET_KEYS


@dataclass
class CompiledPipeline:
    path: Path
    spec: dict
    platform: dict = field(default_factory=dict)  # platforms.kubernetes.deploymentSpec.executors, by label

    @classmethod
    def load(cls, path: str | Path) -> CompiledPipeline:
        path = Path(path)
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if not docs or "pipelineInfo" not in docs[0]:
            raise ValueError(
                f"{path}: not a compiled KFP pipeline (no pipelineInfo in the first YAML document)"
            )
        platform: dict = {}
        for doc in docs[1:]:
            platform = (
                doc.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
            )
        return cls(path=path, spec=docs[0], platform=platform)

    @property
    def name(self) -> str:
        return self.spec["pipelineInfo"]["name"]

    def tasks(self) -> Iterator[tuple[str, str, str]]:
        """(task path like `for-loop-1/train-grpo`, component name, executor label) for every container task."""
        components = self.spec.get("components", {})

        def walk(dag: dict, prefix: str) -> Iterator[tuple[str, str, str]]:
            for task_name, task in dag.get("tasks", {}).items():
                comp_name = task["componentRef"]["name"]
                comp = components.get(comp_name, {})
                if "dag" in comp:
                    yield from walk(comp["dag"], f"{prefix}{task_name}/")
                elif "executorLabel" in comp:
                    yield f"{prefix}{task_name}", comp_name, comp["executorLabel"]

        yield from walk(self.spec["root"]["dag"], "")

    def executor(self, label: str) -> dict:
        return self.spec.get("deploymentSpec", {}).get("executors", {}).get(label, {})

    def resources(self, label: str) -> dict:
        return self.executor(label).get("container", {}).get("resources", {})

    def gpu_tasks(self) -> list[tuple[str, str, str]]:
        return [t for t in self.tasks() if self.resources(t[2]).get("accelerator")]

    def accelerator_count(self, label: str) -> int | str:
        """Executor `label`'s accelerator count: a number, or the name of the pipeline parameter that sets it
        when the run starts (`resourceCount` is then that parameter's placeholder)."""
        acc = self.resources(label).get("accelerator", {})
        raw = str(acc.get("resourceCount") or acc.get("count") or 0)
        runtime = _RUNTIME_PARAMETER.fullmatch(raw)
        return runtime.group(1) if runtime else int(raw)


# how the compiler writes a resource set from a pipeline parameter
_RUNTIME_PARAMETER = re.compile(r"\{\{\$\.inputs\.parameters\['pipelinechannel--(.+)'\]\}\}")


def gpu_problems(
    compiled: CompiledPipeline,
    label: str,
    *,
    gpus: int | str | None = None,
    accelerator: str = "nvidia.com/gpu",
) -> list[str]:
    """What is missing for executor `label` to land on a GPU node with its GPUs; [] when placement is complete.
    `gpus`: the expected count, or the pipeline parameter expected to set it at run time."""
    problems: list[str] = []
    res = compiled.resources(label)
    acc = res.get("accelerator", {})
    kind = acc.get("resourceType") or acc.get("type")
    count = compiled.accelerator_count(label)
    if kind != accelerator:
        problems.append(f"{label}: accelerator type {kind!r}, expected {accelerator!r}")
    if isinstance(count, str):
        params = compiled.spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        default = params.get(count, {}).get("defaultValue")
        if gpus is not None and count != gpus:
            problems.append(f"{label}: accelerator count set at run time by {count!r}, expected {gpus}")
        elif count not in params or (default is not None and int(default) < 1):
            problems.append(
                f"{label}: accelerator count from {count!r}: no pipeline parameter >= 1 by that name"
            )
    elif count < 1 or (gpus is not None and count != gpus):
        problems.append(f"{label}: accelerator count {count}, expected {gpus or '>= 1'}")
    for key in ("resourceCpuRequest", "resourceCpuLimit", "resourceMemoryRequest", "resourceMemoryLimit"):
        if not res.get(key):
            problems.append(f"{label}: no {key}")
    platform = compiled.platform.get(label, {})
    labels = platform.get("nodeSelector", {}).get("labels", {})
    if not labels:
        problems.append(f"{label}: no node selector (expected e.g. {GPU_NODE_SELECTOR})")
    tolerations = platform.get("tolerations", [])
    if not any(t.get("key") == GPU_TOLERATIONS[0]["key"] for t in tolerations):
        problems.append(f"{label}: no toleration for {GPU_TOLERATIONS[0]['key']} taints")
    return problems


def secret_env_problems(compiled: CompiledPipeline, label: str) -> list[str]:
    """[] when executor `label` gets the S3 keys from a Secret (never literal values)."""
    platform = compiled.platform.get(label, {})
    envs = {kv["envVar"] for s in platform.get("secretAsEnv", []) for kv in s.get("keyToEnv", [])}
    missing = sorted(set(S3_SECRET_KEYS.values()) - envs)
    return [f"{label}: S3 credential env {missing} not taken from a Secret"] if missing else []


def literal_env_names(compiled: CompiledPipeline) -> set[str]:
    """Env var names set literally in any container (credentials must never be among them)."""
    names = set()
    for ex in compiled.spec.get("deploymentSpec", {}).get("executors", {}).values():
        for env in ex.get("container", {}).get("env", []) or []:
            names.add(env.get("name", ""))
    return names


def placement_problems(
    compiled: CompiledPipeline, s3_components: AbstractSet[str] = frozenset()
) -> list[str]:
    """Every problem of a compiled pipeline's cluster placement: incomplete GPU placement of steps that
    request accelerators, S3 credentials not from a Secret for `s3_components` (component names without the
    `comp-` prefix and `-N` suffix), credentials set as literal env anywhere."""
    problems = [p for _, _, label in compiled.gpu_tasks() for p in gpu_problems(compiled, label)]
    for task_path, comp_name, label in compiled.tasks():
        base = comp_name.removeprefix("comp-")
        stem, _, suffix = base.rpartition("-")
        if (stem if suffix.isdigit() else base) in s3_components:
            problems += [f"{task_path}: {p}" for p in secret_env_problems(compiled, label)]
    leaked = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & literal_env_names(compiled)
    if leaked:
        problems.append(f"credentials set as literal env: {sorted(leaked)}")
    return problems
