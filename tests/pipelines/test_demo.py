"""`harnessrl demo` picks its source: the cached parse sdist, a fresh download, or (offline) the fixture."""

import io

from rich.console import Console

from pipelines import demo


def test_cached_sdist_is_reused_without_pip(tmp_path, monkeypatch):
    cached = tmp_path / "parse-1.22.4.tar.gz"
    cached.write_bytes(b"not opened here")
    monkeypatch.setattr(demo.subprocess, "run", None)  # any pip call would fail loudly
    assert demo.cached_sdist("parse==1.22.4", cache=tmp_path) == cached


def test_offline_falls_back_to_fixture_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip really runs, with no index: what being offline looks like
    out = io.StringIO()
    assert demo.demo_source(Console(file=out, width=300), cache=tmp_path / "sources") == demo.FIXTURE_REPO
    assert "could not download parse==1.22.4" in out.getvalue() and "test fixture" in out.getvalue()


def test_the_demo_through_a_cli_runs_the_family_through_it_and_refuses_in_one_line(tmp_path, monkeypatch):
    """`harnessrl demo --harness claude-code | codex`: the family's spec names the CLI (a valid spec, with the
    chat demo's reply budget); an unknown harness, or a CLI that is not installed, is one line before anything
    runs."""
    import json

    import pytest

    from harnessrl.cli import main
    from harnessrl.rollout.specs import parse_specs

    for harness in ("claude-code", "codex"):
        args = demo.demo_arguments(tmp_path, 4, harness)
        [spec] = parse_specs(json.loads(str(args["family_specs_json"])))
        assert (spec.spec.harness, spec.spec.limits["reply_tokens"], args["eval_k"]) == (harness, 128, 2)
    assert demo.demo_arguments(tmp_path, 4)["family_specs_json"] == demo.DEMO_FAMILY_SPECS
    with pytest.raises(ValueError, match="--harness 'react': one of chat, claude-code, codex"):
        demo.run_demo(tmp_path / "run", harness="react")
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "empty-cache"))
    assert main(["demo", "--harness", "codex", "--run-dir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
