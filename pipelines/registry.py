"""Every pipeline `harnessrl compile/run/submit` knows, by name. Add a pipeline here to ship it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PipelineEntry:
    name: str
    target: str  # "module:attribute": a @dsl.pipeline, or a zero-argument factory returning one
    summary: str
    local_target: str | None = None  # variant for kfp.local runs (e.g. without GPU placement), if different

    def load(self, local: bool = False) -> Any:
        """The pipeline (a GraphComponent); raises PipelineUnavailable if a stage it needs is missing."""
        module_name, attr = ((local and self.local_target) or self.target).split(":")
        obj = getattr(importlib.import_module(module_name), attr)
        return obj if hasattr(obj, "pipeline_spec") else obj()


PIPELINES: dict[str, PipelineEntry] = {
    e.name: e
    for e in (
        PipelineEntry(
            "data-prep",
            "pipelines.data_prep:data_prep",
            "synthesize a task set from a repo/sdist → clean → validate",
        ),
        PipelineEntry(
            "clean-only",
            "pipelines.data_prep:clean_only",
            "rerun cleaning alone on a task set imported by URI (tasks_uri)",
        ),
        PipelineEntry(
            "validate-only",
            "pipelines.data_prep:validate_only",
            "rerun validation alone on a task set imported by URI (tasks_uri)",
        ),
        PipelineEntry(
            "harnessrl-full",
            "pipelines.full:full_pipeline",
            "data-prep → difficulty → select → rounds of generate → verify → train",
            local_target="pipelines.full:full_pipeline_local",
        ),
    )
}


def get_entry(name: str) -> PipelineEntry:
    try:
        return PIPELINES[name]
    except KeyError:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}") from None


def load_pipeline(name: str, local: bool = False) -> Any:
    return get_entry(name).load(local=local)
