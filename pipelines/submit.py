"""Sends a compiled pipeline to a Kubeflow Pipelines v2 endpoint with `kfp.Client`."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEALTHZ = "/apis/v2beta1/healthz"


class SubmitError(Exception):
    """Submission failed; the message is one line saying why and what to check."""


@dataclass
class Submitted:
    run_id: str
    run_name: str
    url: str
    experiment_id: str | None = None
    pipeline_id: str | None = None
    pipeline_version_id: str | None = None


def check_reachable(host: str, token: str | None, timeout_s: float) -> None:
    """Fails fast (kfp.Client itself retries healthz for ~25 s) with a one-line reason."""
    request = urllib.request.Request(host.rstrip("/") + HEALTHZ)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as e:
        hint = {
            401: "pass --token or set KF_PIPELINES_TOKEN",
            403: "the token lacks access to this namespace",
            404: "is this the KFP API (e.g. the ml-pipeline-ui service), not another service?",
        }
        raise SubmitError(
            f"Kubeflow Pipelines at {host} answered HTTP {e.code} on {HEALTHZ}"
            f"{': ' + hint[e.code] if e.code in hint else ''}"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SubmitError(
            f"cannot reach Kubeflow Pipelines at {host}: {reason} (is the endpoint up? e.g. "
            "`kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`)"
        ) from None


def resolve_package(pipeline: str, workdir: Path) -> tuple[str, Path]:
    """(pipeline name, compiled YAML path) from a YAML path or a registered name (compiled into workdir)."""
    path = Path(pipeline)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise SubmitError(f"{path}: no such pipeline file (compile one with `harnessrl compile`)")
        import yaml

        try:
            first = next(yaml.safe_load_all(path.read_text()))
            return first["pipelineInfo"]["name"], path
        except (yaml.YAMLError, StopIteration, KeyError, TypeError):
            raise SubmitError(f"{path}: not a compiled KFP pipeline (no pipelineInfo.name)") from None
    from pipelines.compile import compile_pipeline
    from pipelines.registry import get_entry

    get_entry(pipeline)
    return pipeline, compile_pipeline(pipeline, workdir / f"{pipeline}.yaml")


def _returned(value: str | None, what: str) -> str:
    """An id the KFP API must have returned (its client models type every field as optional)."""
    if not value:
        raise SubmitError(f"the Kubeflow Pipelines API answered without a {what}")
    return value


def _api_error(e: Exception, action: str) -> SubmitError:
    status = getattr(e, "status", None)
    body = getattr(e, "body", None) or ""
    with_msg = ""
    try:
        with_msg = json.loads(body).get("message", "") if body else ""
    except (ValueError, AttributeError):
        with_msg = str(body)[:200]
    return SubmitError(f"{action} failed: HTTP {status} {getattr(e, 'reason', '')} {with_msg}".strip())


def submit(
    pipeline: str,
    *,
    host: str,
    arguments: list[str] | dict[str, Any] | None = None,
    namespace: str | None = None,
    experiment: str = "harnessrl",
    run_name: str | None = None,
    token: str | None = None,
    pipeline_root: str | None = None,
    service_account: str | None = None,
    upload: bool = False,
    timeout_s: float = 10.0,
) -> Submitted:
    token = token or os.environ.get("KF_PIPELINES_TOKEN")
    check_reachable(host, token, timeout_s)
    import kfp
    from kfp import components
    from kfp_server_api import ApiException

    from pipelines.run_inputs import LocalRunError, parse_arguments

    with tempfile.TemporaryDirectory(prefix="harnessrl-submit-") as tmp:
        name, package = resolve_package(pipeline, Path(tmp))
        if isinstance(arguments, dict):
            args = dict(arguments)
        else:
            try:
                args = parse_arguments(components.load_component_from_file(str(package)), arguments)
            except LocalRunError as e:
                raise SubmitError(str(e)) from None
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        run_name = run_name or f"{name}-{stamp}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            client = kfp.Client(host=host, existing_token=token, namespace=namespace or "kubeflow")
        try:
            if not upload:
                result = client.create_run_from_pipeline_package(
                    str(package),
                    arguments=args,
                    run_name=run_name,
                    experiment_name=experiment,
                    namespace=namespace,
                    pipeline_root=pipeline_root,
                    service_account=service_account,
                )
                run = result.run_info
                run_id = _returned(run.run_id, "run id")
                return Submitted(
                    run_id=run_id,
                    run_name=run_name,
                    experiment_id=run.experiment_id,
                    url=f"{host.rstrip('/')}/#/runs/details/{run_id}",
                )
            pipeline_id = client.get_pipeline_id(name)
            if pipeline_id is None:
                created = client.upload_pipeline(str(package), pipeline_name=name, namespace=namespace)
                pipeline_id = _returned(created.pipeline_id, "pipeline id")
                versions = client.list_pipeline_versions(pipeline_id, page_size=1, sort_by="created_at desc")
                if not versions.pipeline_versions:
                    raise SubmitError(f"pipeline {name} ({pipeline_id}) was uploaded but has no version")
                version_id = versions.pipeline_versions[0].pipeline_version_id
            else:
                version = client.upload_pipeline_version(
                    str(package), pipeline_version_name=f"{name}-{stamp}", pipeline_id=pipeline_id
                )
                version_id = version.pipeline_version_id
            exp = client.create_experiment(experiment, namespace=namespace or "")  # "": the client's default
            run = client.run_pipeline(
                _returned(exp.experiment_id, "experiment id"),
                run_name,
                params=args,
                pipeline_id=pipeline_id,
                version_id=version_id,
                pipeline_root=pipeline_root,
                service_account=service_account,
            )
            run_id = _returned(run.run_id, "run id")
            return Submitted(
                run_id=run_id,
                run_name=run_name,
                experiment_id=exp.experiment_id,
                pipeline_id=pipeline_id,
                pipeline_version_id=version_id,
                url=f"{host.rstrip('/')}/#/runs/details/{run_id}",
            )
        except ApiException as e:
            raise _api_error(e, f"submitting {name} to {host}") from None
