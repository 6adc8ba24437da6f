"""What `harnessrl run` runs, and with which arguments: a registered pipeline or compiled YAML, `k=v` strings
typed by the pipeline's parameters, and `*_uri` arguments made readable by kfp.local (local files only)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class LocalRunError(Exception):
    """The local run could not start (bad pipeline name/file or arguments)."""


def load_runnable(pipeline: str) -> tuple[str, Any]:
    """(name, pipeline object) from a registered name or a compiled pipeline YAML file."""
    from pipelines.registry import PIPELINES, load_pipeline

    if pipeline in PIPELINES:
        return pipeline, load_pipeline(pipeline)
    path = Path(pipeline)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        from kfp import components

        comp = components.load_component_from_file(str(path))
        return comp.name, comp
    raise LocalRunError(
        f"{pipeline!r} is neither a registered pipeline ({', '.join(PIPELINES)}) "
        "nor a compiled pipeline .yaml file"
    )


_CASTS = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float}


def parse_arguments(pipeline: Any, pairs: list[str] | None) -> dict[str, Any]:
    """`k=v` strings typed by the pipeline's parameters; unknown names and bad values are clear errors."""
    inputs = pipeline.component_spec.inputs or {}
    args: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise LocalRunError(f"--arg {pair!r}: expected NAME=VALUE")
        key, value = pair.split("=", 1)
        if key not in inputs:
            raise LocalRunError(
                f"--arg {key}: {pipeline.name} has no parameter {key!r}; "
                f"it has {', '.join(sorted(inputs)) or 'none'}"
            )
        kind = str(inputs[key].type).upper()
        try:
            if kind in ("BOOLEAN", "BOOL"):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                args[key] = value.lower() in ("true", "1", "yes")
            elif kind in ("LIST", "STRUCT", "JSONARRAY", "JSONOBJECT"):
                args[key] = json.loads(value)
            else:
                args[key] = {"INTEGER": int, "FLOAT": float, "DOUBLE": float}.get(
                    kind, _CASTS.get(kind, str)
                )(value)
        except (ValueError, json.JSONDecodeError):
            raise LocalRunError(f"--arg {key}={value!r}: not a valid {inputs[key].type}") from None
    missing = sorted(
        k for k, spec in inputs.items() if k not in args and spec.default is None and not spec.optional
    )
    if missing:
        raise LocalRunError(f"{pipeline.name}: missing required argument(s) {missing}; pass --arg NAME=VALUE")
    return args


def localize_uris(args: Mapping[str, Any], inputs_dir: Path | None = None) -> dict[str, Any]:
    """Makes `*_uri` arguments readable by kfp.local, which only reads local files: local paths become
    absolute; `s3://`/`minio://` URIs are fetched with harnessrl.store into `inputs_dir` (resumable,
    checksum-verified) and replaced by the local copy."""
    out = dict(args)
    for key, value in args.items():
        if not (key.endswith("_uri") and isinstance(value, str)):
            continue
        if value.startswith(("s3://", "minio://")) and inputs_dir is not None:
            out[key] = str(fetch_remote_input(value, inputs_dir / key))
        elif "://" not in value:
            path = Path(value).expanduser()
            if not path.exists():
                raise LocalRunError(f"--arg {key}={value}: no such file or directory")
            out[key] = str(path.resolve())
    return out


def fetch_remote_input(uri: str, dest_dir: Path) -> Path:
    """One object → dest_dir/<name>; a prefix (e.g. a task-set directory) → dest_dir/<last path part>/."""
    from harnessrl.store import ObjectStore, S3Uri, StoreError

    parsed = S3Uri.parse(uri)
    name = parsed.key.rstrip("/").rsplit("/", 1)[-1] or parsed.bucket
    try:
        store = ObjectStore.from_env()
        if parsed.key and not parsed.key.endswith("/"):
            try:
                store.stat(uri)
                return store.download_file(uri, dest_dir / name).path
            except StoreError as e:
                if "NoSuchKey" not in str(e) and "404" not in str(e):
                    raise
        store.download_dir(uri, dest_dir / name)
        return dest_dir / name
    except StoreError as e:
        raise LocalRunError(f"fetching {uri} for the local run: {e}") from None
