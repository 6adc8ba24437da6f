"""`harnessrl-full`: data-prep → estimate difficulty → select → rounds of generate → verify → train.

Extension point: each later stage is a `StageSlot` naming the KFP component its owner writes in
`components/<stage>/component.py`. Steps are wired **by name**: a component input is fed the upstream output
(or pipeline parameter) of the same name, or of the name its slot's `aliases` maps it to. Inputs with
defaults and no upstream keep their defaults. So a stage slots in by naming its inputs after what exists
(`tasks`, `selected`, `rollouts`, `verified`, `checkpoint`, ...) — no edits to this file beyond its slot.

Rounds are unrolled at compile time (`rounds`), because round r+1's policy is round r's checkpoint: a
`dsl.ParallelFor` cannot carry state between iterations. Until every slot's component exists the pipeline
is not built and `build_full_pipeline` raises `PipelineUnavailable` naming what is missing.
"""

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfp import dsl

from pipelines.data_prep import add_data_prep
from pipelines.k8s import gpu_step, use_s3_credentials

FULL_PIPELINE_NAME = "harnessrl-full"


class PipelineUnavailable(Exception):
    """The pipeline cannot be built in this checkout (a stage's component is not there yet)."""


@dataclass(frozen=True)
class StageSlot:
    stage: str
    target: Any  # "module:attribute" of the KFP component (or the component itself)
    per_round: bool = False  # inside the generate → verify → train loop
    gpus: int = 0  # > 0: placed on GPU nodes with `gpu_step`
    streams_large_objects: bool = False  # gets S3 credentials from the Secret
    aliases: Mapping[str, str] = field(default_factory=dict)  # component input -> upstream name

    def load(self) -> Any:
        if not isinstance(self.target, str):
            return self.target
        module_name, attr = self.target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):
                raise PipelineUnavailable(f"{self.stage}: module {module_name} does not exist yet") from None
            raise
        if not hasattr(module, attr):
            raise PipelineUnavailable(f"{self.stage}: {module_name} has no component {attr!r}")
        return getattr(module, attr)


STAGE_SLOTS: tuple[StageSlot, ...] = (
    StageSlot(
        "estimate_difficulty",
        "components.estimate_difficulty.component:estimate_difficulty",
        gpus=1,
        aliases={"model": "checkpoint", "policy": "checkpoint", "n": "difficulty_n"},
    ),
    StageSlot(
        "select", "components.estimate_difficulty.component:select", aliases={"difficulty": "estimates"}
    ),
    StageSlot(
        "generate_rollouts",
        "components.generate.component:generate_rollouts",
        per_round=True,
        gpus=1,
        streams_large_objects=True,
        aliases={"tasks": "selected", "model": "checkpoint", "policy": "checkpoint"},
    ),
    StageSlot("verify", "components.verify.component:verify", per_round=True, aliases={"tasks": "selected"}),
    StageSlot(
        "train_grpo",
        "components.train.component:train_grpo",
        per_round=True,
        gpus=1,
        streams_large_objects=True,
        aliases={"model": "checkpoint", "policy": "checkpoint"},
    ),
)


def component_inputs(comp: Any) -> dict[str, Any]:
    return dict(comp.component_spec.inputs or {})


def component_outputs(comp: Any) -> dict[str, Any]:
    return dict(comp.component_spec.outputs or {})


def wire(slot: StageSlot, comp: Any, pool: Mapping[str, Any], *, cluster: bool) -> dsl.PipelineTask:
    """Calls `comp` with every input found in `pool` (directly or via the slot's aliases)."""
    kwargs: dict[str, Any] = {}
    missing: list[str] = []
    for name, spec in component_inputs(comp).items():
        source = slot.aliases.get(name, name) if slot.aliases.get(name, name) in pool else name
        if source in pool:
            kwargs[name] = pool[source]
        elif spec.default is None and not spec.optional:
            missing.append(name)
    if missing:
        raise PipelineUnavailable(
            f"{slot.stage}: input(s) {missing} have no upstream; available: {sorted(pool)}. Rename the input "
            f"after an upstream output or add an alias to its StageSlot in pipelines/full.py"
        )
    task = comp(**kwargs)
    if cluster and slot.gpus:
        gpu_step(task, gpus=slot.gpus)
    if cluster and slot.streams_large_objects:
        use_s3_credentials(task)
    return task


def publish_outputs(task: dsl.PipelineTask, comp: Any, pool: dict[str, Any]) -> None:
    """Adds the step's data outputs to the pool by name (reports and metrics are for people, not steps);
    a Model output also becomes the current `checkpoint`."""
    for name, spec in component_outputs(comp).items():
        if str(spec.type).startswith(("system.Metrics", "system.Markdown", "system.HTML")):
            continue
        pool[name] = task.outputs[name]
        if str(spec.type).startswith("system.Model"):
            pool["checkpoint"] = task.outputs[name]


def build_full_pipeline(
    slots: Sequence[StageSlot] = STAGE_SLOTS,
    *,
    rounds: int = 2,
    cluster: bool = True,
    name: str = FULL_PIPELINE_NAME,
) -> Any:
    """The full pipeline, with `rounds` generate → verify → train rounds; raises PipelineUnavailable."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    loaded, missing = [], []
    for slot in slots:
        try:
            loaded.append((slot, slot.load()))
        except PipelineUnavailable as e:
            missing.append(str(e))
    if missing:
        raise PipelineUnavailable("; ".join(missing))

    @dsl.pipeline(
        name=name,
        description="Data prep, difficulty estimation and selection, then rounds of "
        "rollout generation, verification and GRPO training.",
    )
    def harnessrl_full(
        source_uri: str,
        base_model_uri: str,
        max_tasks: int = 20,
        seed: int = 0,
        timeout_s: float = 120.0,
        max_tests: int = 200,
        require_f2p: bool = True,
        require_problem_statement: bool = True,
        check_branches: bool = True,
        drop_duplicates: bool = True,
        engine_url: str = "",
        specs_json: str = "",
        group_size: int = 4,
        difficulty_n: int = 4,
        k_all_fail: int = 1000,
        config_json: str = "{}",
    ):
        prep = add_data_prep(
            source_uri,
            max_tasks=max_tasks,
            seed=seed,
            timeout_s=timeout_s,
            max_tests=max_tests,
            require_f2p=require_f2p,
            require_problem_statement=require_problem_statement,
            check_branches=check_branches,
            drop_duplicates=drop_duplicates,
        )
        base_model = dsl.importer(artifact_uri=base_model_uri, artifact_class=dsl.Model, reimport=False)
        base_model.set_display_name("import-base-model")
        # pipeline parameters later stages take by name (engine_url: e.g. http://vllm.harnessrl:8000)
        pool: dict[str, Any] = {
            "tasks": prep.tasks,
            "checkpoint": base_model.output,
            "seed": seed,
            "engine_url": engine_url,
            "specs_json": specs_json,
            "group_size": group_size,
            "difficulty_n": difficulty_n,
            "k_all_fail": k_all_fail,
            "config_json": config_json,
        }
        previous: dsl.PipelineTask = prep.gate
        for round_index in range(rounds + 1):
            for slot, comp in loaded:
                if slot.per_round != (round_index > 0):
                    continue
                task = wire(slot, comp, pool, cluster=cluster).after(previous)
                suffix = f"-round-{round_index}" if slot.per_round else ""
                task.set_display_name(f"{slot.stage.replace('_', '-')}{suffix}")
                publish_outputs(task, comp, pool)
                previous = task

    return harnessrl_full


def full_pipeline() -> Any:
    """Registry entry point (see pipelines/registry.py): the cluster build."""
    return build_full_pipeline()


def full_pipeline_local() -> Any:
    """What `harnessrl run harnessrl-full` runs: no Kubernetes placement (kfp.local ignores it anyway)."""
    return build_full_pipeline(cluster=False)
