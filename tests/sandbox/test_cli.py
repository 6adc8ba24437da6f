"""`harnessrl sandbox ...` commands."""

import json

from harnessrl.cli import main
from harnessrl.sandbox.cli import render_manifest_files
from harnessrl.sandbox.kubernetes import KubernetesConfig
from tests.support.fixtures import requires_bwrap


@requires_bwrap
def test_materialize_then_run(synth_taskset, tmp_path, capsys):
    from harnessrl.taskset import TaskSet

    iid = TaskSet.open(synth_taskset).rows()[0]["instance_id"]
    ws = tmp_path / "ws"
    assert (
        main(["sandbox", "materialize", "--tasks", str(synth_taskset), "--instance", iid, "--dest", str(ws)])
        == 0
    )
    assert capsys.readouterr().out.strip() == str(ws) and (ws / ".git").is_dir()
    code = main(
        [
            "sandbox",
            "run",
            "--workspace",
            str(ws),
            "--tasks",
            str(synth_taskset),
            "--timeout",
            "60",
            "--",
            "python",
            "-c",
            "import minicalc, os; print(minicalc.__name__, os.getcwd())",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["outcome"] == "ok" and result["stdout"].split() == ["minicalc", "/workspace"]
    assert main(["sandbox", "run", "--workspace", str(ws)]) == 2
    assert "no command" in capsys.readouterr().err


def test_manifests_command_writes_what_is_rendered(tmp_path, capsys):
    assert main(["sandbox", "manifests", "--out", str(tmp_path), "--image", "example.org/h:1"]) == 0
    expected = render_manifest_files(KubernetesConfig(image="example.org/h:1"))
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == expected
    assert "example.org/h:1" in expected["pod-template.yaml"]
