"""The console side of `harnessrl run`: one line per step, cache hits, a heartbeat for long steps."""

import io
import threading
import time

from rich.console import Console

from pipelines.local_run import RunResult, _ProgressTee


def make_tee():
    out, log = io.StringIO(), io.StringIO()
    return _ProgressTee(log, Console(file=out, width=200), verbose=False), out, log


def test_step_lines_cache_hits_and_failure_capture():
    tee, out, log = make_tee()
    tee.write(
        "12:00 - INFO - Executing task \x1b[96m'clean'\x1b[0m\n    Traceback (most recent call last):\n"
    )
    tee.write("    ValueError: tasks.jsonl:3: malformed JSON\n")
    tee.write("12:01 - ERROR - Task 'clean' finished with status FAILURE\n")
    tee.write("12:01 - INFO - Task synthesize cache hit (key=abcdef012345); skipping execution.\n")
    text = out.getvalue()
    assert "▶ clean" in text and "✗ clean" in text and "✓ synthesize (cached)" in text
    assert tee.failed == "clean" and tee.cache_hits == {"synthesize": "abcdef012345"}
    assert "malformed JSON" in log.getvalue()  # everything reaches run.log
    result = RunResult(run_dir=None, status="failed", failed_task="clean", failed_log=tee.failed_lines)
    assert result.failure_reason == "ValueError: tasks.jsonl:3: malformed JSON"


def test_heartbeat_for_long_steps():
    tee, out, _ = make_tee()
    tee.write("Executing task 'train-grpo'\n")
    beat = threading.Thread(target=tee._beat, kwargs={"every_s": 0.05}, daemon=True)
    beat.start()
    time.sleep(0.3)
    tee.write("Task 'train-grpo' finished with status SUCCESS\n")
    tee._stop.set()
    beat.join(1)
    assert "train-grpo running for" in out.getvalue()
