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

    def load(self) -> Any:
        """The pipeline (a GraphComponent)."""
        module_name, attr = self.target.split(":")
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
            "pipelines.full:harnessrl_full",
            "data-prep → difficulty → select → rl loop (sync / colocated / separate async)",
        ),
        PipelineEntry(
            "harnessrl-full-cold-start",
            "pipelines.full:harnessrl_full_cold_start",
            "harnessrl-full with an SFT cold start (scripted gold-fix demonstrations) before the rl loop",
        ),
        PipelineEntry(
            "harnessrl-rounds",
            "pipelines.rounds:harnessrl_rounds",
            "data-prep → difficulty → select → rounds unrolled as generate → verify → train steps",
        ),
    )
}


def get_entry(name: str) -> PipelineEntry:
    try:
        return PIPELINES[name]
    except KeyError:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}") from None


def load_pipeline(name: str) -> Any:
    return get_entry(name).load()
