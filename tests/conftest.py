import shutil

import pytest

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")


# --- dataprep (task synthesis) -------------------------------------------------------------------------
from pathlib import Path  # noqa: E402

MINIREPO = Path(__file__).parent / "fixtures" / "minirepo"

# tests/fixtures/minirepo is a repository *under test* (its tests import `minicalc` from its own root).
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def synth_taskset(tmp_path_factory) -> Path:
    """A task-set dir synthesized (once per session) from tests/fixtures/minirepo: >= 3 SWE-smith tasks.

    Shared by every test in the session: treat it as read-only (copy it with shutil.copytree to modify)."""
    from harnessrl.dataprep.synthesize import synthesize_taskset

    out = tmp_path_factory.mktemp("synth") / "minirepo-tasks"
    ts = synthesize_taskset(MINIREPO, out, max_tasks=4, seed=0, show_progress=False)
    assert len(ts.rows()) >= 3, f"minirepo synthesis produced too few tasks; see {out}/manifest.json"
    return out


# --- S3 (harnessrl.store) -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_server() -> str:
    """A real S3 endpoint for the session: moto's server on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> str:
    """Points `ObjectStore.from_env()` (and every step it spawns) at the session's S3 endpoint."""
    for key, value in {"HARNESSRL_S3_ENDPOINT": s3_server, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing-secret", "HARNESSRL_S3_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    return s3_server
