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
