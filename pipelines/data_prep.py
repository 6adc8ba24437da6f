"""Data-prep pipelines: synthesize → clean → validate, and per-stage entry pipelines that import upstream
artifacts by URI (so e.g. only filtering can be rerun on the cluster).

The `add_*` builders append steps to the pipeline being defined and return the channels later stages
consume; `harnessrl-full` (pipelines/full.py) reuses them unchanged.
"""

from dataclasses import dataclass

from kfp import dsl
from kfp.dsl.pipeline_channel import PipelineChannel, PipelineParameterChannel

from components.clean.component import clean
from components.synthesize.component import synthesize
from components.validate.component import validate


@dataclass
class DataPrepOutputs:
    tasks: PipelineChannel  # the cleaned task set (a Dataset directory)
    gate: dsl.PipelineTask  # downstream steps run `.after(gate)`: only validated data flows on


def import_dataset(uri: str | PipelineParameterChannel) -> dsl.PipelineTask:
    """An upstream Dataset by URI (`minio://…`, `s3://…` on a cluster, an absolute path locally)."""
    return dsl.importer(artifact_uri=uri, artifact_class=dsl.Dataset, reimport=False)


def add_clean_validate(
    tasks: PipelineChannel,
    *,
    max_tests,
    require_f2p,
    require_problem_statement,
    check_branches,
    drop_duplicates,
) -> DataPrepOutputs:
    cleaned = clean(
        tasks=tasks,
        max_tests=max_tests,
        require_f2p=require_f2p,
        require_problem_statement=require_problem_statement,
        check_branches=check_branches,
        drop_duplicates=drop_duplicates,
    )
    checked = validate(tasks=cleaned.outputs["kept"])
    return DataPrepOutputs(tasks=cleaned.outputs["kept"], gate=checked)


def add_data_prep(
    source_uri,
    *,
    max_tasks,
    seed,
    timeout_s,
    max_tests,
    require_f2p,
    require_problem_statement,
    check_branches,
    drop_duplicates,
) -> DataPrepOutputs:
    source = dsl.importer(artifact_uri=source_uri, artifact_class=dsl.Artifact, reimport=False)
    source.set_display_name("import-source")
    synthesized = synthesize(source=source.output, max_tasks=max_tasks, seed=seed, timeout_s=timeout_s)
    return add_clean_validate(
        synthesized.outputs["tasks"],
        max_tests=max_tests,
        require_f2p=require_f2p,
        require_problem_statement=require_problem_statement,
        check_branches=check_branches,
        drop_duplicates=drop_duplicates,
    )


@dsl.pipeline(name="data-prep", description="Synthesize a task set from a repo/sdist, clean it, validate it.")
def data_prep(
    source_uri: str,
    max_tasks: int = 20,
    seed: int = 0,
    timeout_s: float = 120.0,
    max_tests: int = 200,
    require_f2p: bool = True,
    require_problem_statement: bool = True,
    check_branches: bool = True,
    drop_duplicates: bool = True,
):
    add_data_prep(
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


@dsl.pipeline(name="clean-only", description="Rerun filtering alone on a task set imported by URI.")
def clean_only(
    tasks_uri: str,
    max_tests: int = 200,
    require_f2p: bool = True,
    require_problem_statement: bool = True,
    check_branches: bool = True,
    drop_duplicates: bool = True,
):
    imported = import_dataset(tasks_uri)
    clean(
        tasks=imported.output,
        max_tests=max_tests,
        require_f2p=require_f2p,
        require_problem_statement=require_problem_statement,
        check_branches=check_branches,
        drop_duplicates=drop_duplicates,
    )


@dsl.pipeline(
    name="validate-only", description="Rerun the Great Expectations suite on a task set imported by URI."
)
def validate_only(tasks_uri: str, fail_on_violation: bool = True):
    imported = import_dataset(tasks_uri)
    validate(tasks=imported.output, fail_on_violation=fail_on_violation)
