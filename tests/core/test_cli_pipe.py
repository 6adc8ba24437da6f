"""`harnessrl ... | head`: a reader that goes away early must not turn into a traceback."""

import subprocess
import sys


def test_closed_stdout_pipe_is_not_a_traceback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "pipelines"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes its first line
    stderr = proc.stderr.read()
    code = proc.wait(timeout=120)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert code == 141
