"""A wheel built from the repo installs with --no-deps into a plain venv and its packages import there."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("harnessrl-*.whl")
    return whl


# The tree is the import path: the shared libraries (`harnessrl`) and the pipeline's own top-level folders
# install under their folder names; tests, benchmarks and component tests never ship.
TOP_LEVEL = {"harnessrl", "components", "pipelines", "dataprep"}


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == TOP_LEVEL, f"unexpected top-level names in the wheel: {top ^ TOP_LEVEL}"
    for required in (
        "harnessrl/cli.py",
        "harnessrl/store.py",
        "harnessrl/engine/local.py",
        "harnessrl/gateway/server.py",
        "pipelines/cli.py",
        "pipelines/full.py",
        "components/common.py",
        "components/clean/component.py",
        "components/train/component.py",
        "dataprep/__init__.py",
    ):
        assert required in names, required
    assert not any("/tests/" in n or n.startswith(("tests/", "benchmarks/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "harnessrl = harnessrl.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_imports_in_a_clean_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    code = (
        "import harnessrl, pipelines, components, dataprep, sys; "
        "assert 'kfp' not in sys.modules; print(harnessrl.__file__)"
    )
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert str(env_dir) in proc.stdout, f"imported from {proc.stdout.strip()}, not the clean venv"
    # third-party deps are really absent there, so this isolation is meaningful
    probe = subprocess.run(
        [str(python), "-c", "import kfp"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert probe.returncode != 0
