"""Compiles every registered pipeline to KFP IR YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kfp import compiler

from harnessrl.io import atomic_write_text
from pipelines.registry import PIPELINES, load_pipeline


def compile_to_file(pipeline: Any, out: Path) -> Path:
    """Compiles a pipeline (a `@dsl.pipeline`; typed Any: kfp's decorator is untyped) to `out` atomically."""
    tmp = out.with_name(f".{out.name}.compiling.yaml")
    try:
        compiler.Compiler().compile(pipeline, str(tmp))
        atomic_write_text(out, tmp.read_text())
    finally:
        tmp.unlink(missing_ok=True)
    return out


def compile_pipeline(name: str, out: Path) -> Path:
    """Compiles one registered pipeline to `out` (a .yaml file) atomically."""
    return compile_to_file(load_pipeline(name), out)


def compile_all(out_dir: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Compiles the named pipelines (default: all) into `out_dir`; returns name -> written file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {name: compile_pipeline(name, out_dir / f"{name}.yaml") for name in names or list(PIPELINES)}
