"""Compiles every registered pipeline to KFP IR YAML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kfp import compiler

from harnessrl.io import atomic_write_text
from pipelines.full import PipelineUnavailable
from pipelines.registry import PIPELINES, load_pipeline


@dataclass
class CompileResult:
    written: dict[str, Path]
    skipped: dict[str, str]  # pipeline name -> why it could not be built in this checkout


def compile_pipeline(name: str, out: Path) -> Path:
    """Compiles one pipeline to `out` (a .yaml file) atomically."""
    pipeline = load_pipeline(name)
    tmp = out.with_name(f".{out.name}.compiling.yaml")
    try:
        compiler.Compiler().compile(pipeline, str(tmp))
        atomic_write_text(out, tmp.read_text())
    finally:
        tmp.unlink(missing_ok=True)
    return out


def compile_all(out_dir: str | Path, names: list[str] | None = None) -> CompileResult:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = CompileResult(written={}, skipped={})
    for name in names or list(PIPELINES):
        try:
            result.written[name] = compile_pipeline(name, out_dir / f"{name}.yaml")
        except PipelineUnavailable as e:
            result.skipped[name] = str(e)
    return result
