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
