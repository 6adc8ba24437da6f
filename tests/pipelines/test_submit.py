"""`harnessrl submit` against a closed port and against a recording KFP v2beta1 API server on loopback."""

import socket
from email.parser import BytesParser
from email.policy import HTTP

import yaml

from harnessrl.cli import main
from pipelines.compile import compile_pipeline


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_host_is_one_line_error(capsys):
    port = closed_port()
    code = main(["submit", "clean-only", "--host", f"http://127.0.0.1:{port}", "--arg", "tasks_uri=s3://b/t"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, err
    assert f"cannot reach Kubeflow Pipelines at http://127.0.0.1:{port}" in err
    assert "Traceback" not in err


def test_run_create_request_is_well_formed(kfp_api, tmp_path, capsys):
    host, state = kfp_api
    package = compile_pipeline("clean-only", tmp_path / "clean-only.yaml")
    code = main(
        [
            "submit",
            str(package),
            "--host",
            host,
            "--experiment",
            "nightly",
            "--run-name",
            "rerun-clean",
            "--token",
            "tok123",
            "--arg",
            "tasks_uri=minio://harnessrl/tasks/v1",
            "--arg",
            "max_tests=150",
            "--arg",
            "check_branches=false",
            "--pipeline-root",
            "minio://harnessrl/pipeline-root",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "submitted run" in out.out
    # the experiment is looked up by name, then created
    lookups = state.find("GET", "/apis/v2beta1/experiments")
    assert lookups and "nightly" in lookups[0].query["filter"][0]
    (create_exp,) = state.find("POST", "/apis/v2beta1/experiments")
    assert create_exp.json()["display_name"] == "nightly"
    (create_run,) = state.find("POST", "/apis/v2beta1/runs")
    body = create_run.json()
    assert body["display_name"] == "rerun-clean"
    assert body["experiment_id"] == state.experiments[0]["experiment_id"]
    compiled = yaml.safe_load(package.read_text())
    assert body["pipeline_spec"]["pipelineInfo"]["name"] == "clean-only"
    assert body["pipeline_spec"]["root"] == compiled["root"]
    assert body["runtime_config"]["parameters"] == {
        "tasks_uri": "minio://harnessrl/tasks/v1",
        "max_tests": 150,
        "check_branches": False,
    }
    assert body["runtime_config"]["pipeline_root"] == "minio://harnessrl/pipeline-root"
    assert all(r.headers.get("authorization") == "Bearer tok123" for r in state.requests)


def test_upload_then_new_version_then_run(kfp_api, tmp_path, capsys):
    host, state = kfp_api
    for _attempt in range(2):
        code = main(
            ["submit", "validate-only", "--host", host, "--upload", "--arg", "tasks_uri=s3://b/tasks"]
        )
        assert code == 0, capsys.readouterr().err
    (upload,) = state.find("POST", "/apis/v2beta1/pipelines/upload")
    assert upload.query["name"] == ["validate-only"]
    ctype = upload.headers["content-type"]
    assert ctype.startswith("multipart/form-data")
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + upload.body)
    (part,) = [
        p for p in message.iter_parts() if p.get_param("name", header="content-disposition") == "uploadfile"
    ]
    payload = part.get_payload(decode=True)
    assert isinstance(payload, bytes)
    uploaded = yaml.safe_load(payload)
    assert uploaded["pipelineInfo"]["name"] == "validate-only"
    (new_version,) = state.find("POST", "/apis/v2beta1/pipelines/upload_version")
    assert new_version.query["pipelineid"] == [state.pipelines[0]["pipeline_id"]]
    runs = [r.json() for r in state.find("POST", "/apis/v2beta1/runs")]
    assert len(runs) == 2
    versions = state.versions[state.pipelines[0]["pipeline_id"]]
    assert [r["pipeline_version_reference"]["pipeline_version_id"] for r in runs] == [
        v["pipeline_version_id"] for v in versions
    ]
    assert all("pipeline_spec" not in r for r in runs)
    assert runs[0]["runtime_config"]["parameters"] == {"tasks_uri": "s3://b/tasks"}


def test_bad_arguments_are_clear(kfp_api, capsys):
    host, _ = kfp_api
    assert main(["submit", "clean-only", "--host", host, "--arg", "nope=1"]) == 2
    assert "has no parameter 'nope'" in capsys.readouterr().err
    assert (
        main(["submit", "clean-only", "--host", host, "--arg", "tasks_uri=x", "--arg", "max_tests=many"]) == 2
    )
    assert "not a valid" in capsys.readouterr().err
    assert main(["submit", "missing.yaml", "--host", host]) == 2
    assert "no such pipeline file" in capsys.readouterr().err


def test_namespace_goes_to_experiment_and_lookup(kfp_api, capsys):
    host, state = kfp_api
    assert (
        main(["submit", "clean-only", "--host", host, "--namespace", "team-a", "--arg", "tasks_uri=s3://b/t"])
        == 0
    )
    (lookup,) = state.find("GET", "/apis/v2beta1/experiments")
    assert lookup.query["namespace"] == ["team-a"]
    (create_exp,) = state.find("POST", "/apis/v2beta1/experiments")
    assert create_exp.json()["namespace"] == "team-a" and create_exp.json()["display_name"] == "harnessrl"
