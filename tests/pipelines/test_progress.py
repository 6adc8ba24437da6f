"""Logging setup, the one progress switch, and the console side of `harnessrl run` (step lines, cache hits,
failures, interruptions), on real terminals (pseudo-terminals) and real kfp.local runs of small pipelines."""

import io
import json
import logging
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kfp import dsl
from rich.console import Console

from components.common import component
from harnessrl.cli import main
from harnessrl.logs import LOG_LEVEL_ENV, PACKAGES, configure_logging, is_quiet
from harnessrl.progress import PROGRESS_ENV, ProgressBar, progress_enabled, track
from pipelines.compile import compile_to_file
from pipelines.local_run import RunStatus, StepLines, run_local
from pipelines.local_tasks import TaskRecord, TaskStatus, TaskWatcher
from pipelines.run_inputs import LocalRunError

REPO = Path(__file__).resolve().parents[2]
MINIREPO = REPO / "tests" / "fixtures" / "minirepo"


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch):
    """configure_logging changes process-wide state: put it back after each test."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {p: logging.getLogger(p).level for p in PACKAGES})
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for package, level in saved[2].items():
        logging.getLogger(package).setLevel(level)


@pytest.fixture
def terminal(monkeypatch):
    """Call it in the test (pytest's capture resets sys.stderr after fixtures run): puts sys.stderr on a real
    pseudo-terminal and returns a function reading what reached that terminal."""
    controller, tty_fd = pty.openpty()
    tty = os.fdopen(tty_fd, "w")

    def read() -> str:
        tty.flush()
        chunks = []
        while select.select([controller], [], [], 0.2)[0]:
            chunks.append(os.read(controller, 65536))
        return b"".join(chunks).decode(errors="replace")

    def attach():
        monkeypatch.setattr(sys, "stderr", tty)
        return read

    yield attach
    tty.close()
    os.close(controller)


def test_bar_shows_on_a_terminal(terminal):
    read = terminal()
    configure_logging(logging.INFO)
    assert progress_enabled()
    with ProgressBar("verify", total=3) as bar:
        for resolved in range(3):
            bar.advance(description=f"verify: {resolved + 1} resolved")
    text = read()
    assert "verify: 3 resolved" in text and "3/3" in text


@pytest.mark.parametrize(
    "switch_off",
    [
        pytest.param(lambda mp: mp.setenv(PROGRESS_ENV, "0"), id="HARNESSRL_PROGRESS=0"),
        pytest.param(lambda mp: mp.setenv("RANK", "1"), id="torchrun-worker-rank"),
        pytest.param(lambda mp: configure_logging(logging.WARNING), id="quiet-logging"),
        pytest.param(lambda mp: mp.setattr(sys, "stderr", io.StringIO()), id="stderr-not-a-terminal"),
    ],
)
def test_each_condition_switches_progress_off(terminal, monkeypatch, switch_off):
    read = terminal()
    configure_logging(logging.INFO)
    assert progress_enabled()
    switch_off(monkeypatch)
    assert not progress_enabled()
    assert list(track(range(5), "nothing to see")) == list(range(5))
    assert "nothing to see" not in read()


def test_small_jobs_get_no_bar(terminal):
    read = terminal()
    configure_logging(logging.INFO)
    assert not ProgressBar("tiny", total=10, min_total=1000).shown
    assert ProgressBar("big", total=2000, min_total=1000).shown
    for _ in track(range(10), "tiny job", min_total=1000):
        pass
    assert "tiny job" not in read()


def test_logging_levels_from_the_cli_flags(capsys):
    from kubernetes import client

    client.Configuration()  # sets urllib3's logger to WARNING itself (as any test or stage using it does)
    unknown = ["run", "no-such-pipeline"]  # a command that fails fast, after logging is set up
    assert main(["-q", *unknown]) == 2
    assert is_quiet() and logging.getLogger("dataprep.clean").getEffectiveLevel() == logging.WARNING
    assert main(unknown) == 2
    assert not is_quiet() and logging.getLogger("harnessrl").level == logging.INFO
    assert main(["-v", *unknown]) == 2
    assert logging.getLogger("pipelines.local_run").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("urllib3").isEnabledFor(logging.INFO)  # other libraries: warnings only
    assert main(["-vv", *unknown]) == 2
    assert logging.getLogger("urllib3").isEnabledFor(logging.DEBUG)
    assert os.environ.get(PROGRESS_ENV) is None and os.environ.get(LOG_LEVEL_ENV) is None  # restored


def test_compact_log_lines_and_third_party_filtering(capsys):
    configure_logging(logging.INFO)
    configure_logging(logging.INFO)  # a second call replaces the first: one line per record, not two
    logging.getLogger("dataprep.clean").info("kept %d of %d", 3, 4)
    logging.getLogger("urllib3.connectionpool").warning("retrying")
    logging.getLogger().setLevel(logging.INFO)  # as kfp.local does during a run
    logging.getLogger("httpx").info("HTTP Request: POST /v1/completions")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].endswith(" I dataprep.clean: kept 3 of 4") and err[1].endswith(
        " W urllib3.connectionpool: retrying"
    )


def test_a_component_process_logs_each_record_once():
    """KFP's executor configures logging (basicConfig to stdout, INFO) before a component's code runs; the
    component's configure_logging() takes over: our records once, compact; chatty libraries quiet."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, format='[KFP Executor] %(message)s', level=logging.INFO)\n"
        "from harnessrl.logs import configure_logging\n"
        "configure_logging()\n"
        "logging.getLogger('components.clean.stage').info('kept 3 of 4')\n"
        "logging.getLogger('httpx').info('HTTP Request: POST /v1/completions')\n"
    )
    env = {**os.environ, LOG_LEVEL_ENV: "INFO"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) == 1 and lines[0].endswith(" I components.clean.stage: kept 3 of 4"), lines


def test_bad_log_level_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setenv(LOG_LEVEL_ENV, "loud")
    assert main(["pipelines"]) == 2
    assert "log level 'loud': use one of DEBUG, INFO, WARNING, ERROR" in capsys.readouterr().err


def test_cli_progress_flags_on_a_real_terminal(tmp_path):
    """`harnessrl tasks synthesize` with stderr on a pseudo-terminal: a bar by default, none with
    --no-progress, none and no INFO lines with -q."""

    def run(*flags: str) -> str:
        controller, tty_fd = pty.openpty()
        out = tmp_path / f"tasks{len(flags)}{'q' if '-q' in flags else ''}"
        cmd = [sys.executable, "-m", "harnessrl.cli", *flags, "tasks", "synthesize", str(MINIREPO)]
        proc = subprocess.Popen(
            [*cmd, "--out", str(out), "--max-tasks", "1"], stderr=tty_fd, stdout=subprocess.DEVNULL, cwd=REPO
        )
        os.close(tty_fd)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: the process is done
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=120) == 0
        os.close(controller)
        return b"".join(chunks).decode(errors="replace")

    shown = run()
    assert "synthesize minirepo" in shown and "━" in shown
    hidden = run("--no-progress")
    assert "synthesize minirepo" not in hidden and "━" not in hidden
    quiet = run("-q")
    assert "━" not in quiet and " I " not in quiet


# ---- the console side of `harnessrl run`, on real kfp.local runs ----


@component
def produce(words: dsl.Output[dsl.Dataset], count: int = 2) -> int:
    print("producing", count)
    with open(words.path, "w") as f:
        f.write("w\n" * count)
    return count


@component
def consume(
    words: dsl.Input[dsl.Dataset], note: dsl.Output[dsl.Artifact], fail: bool = False, sleep_s: float = 0.0
) -> str:
    import time

    print("line one of the step", flush=True)
    with open(note.path, "w") as f:
        f.write("written before any failure\n")
    time.sleep(sleep_s)
    if fail:
        raise ValueError("tasks.jsonl:3: malformed JSON")
    return open(words.path).read().strip()


@component
def switches() -> str:
    import os

    return f"{os.environ.get('HARNESSRL_PROGRESS')},{os.environ.get('HARNESSRL_LOG_LEVEL')}"


@dsl.pipeline(name="switches")
def report_switches():
    switches()


def test_cli_switches_reach_the_steps(tmp_path, capsys):
    """`harnessrl -q run` / `--no-progress`: the step processes kfp.local starts see the same choices."""
    path = compile_to_file(report_switches, tmp_path / "switches.yaml")
    seen = {}
    for flags in (["-q"], ["--no-progress"], ["-v"]):
        run_dir = tmp_path / flags[0].strip("-")
        assert main([*flags, "run", str(path), "--run-dir", str(run_dir), "--no-cache"]) == 0
        index = json.loads((run_dir / "run.json").read_text())
        seen[flags[0]] = index["tasks"]["switches"]["outputs"]["Output"]["value"]
    assert seen == {"-q": "0,WARNING", "--no-progress": "0,INFO", "-v": "None,DEBUG"}


@dsl.pipeline(name="tiny")
def tiny(count: int = 2, fail: bool = False, sleep_s: float = 0.0):
    made = produce(count=count)
    consume(words=made.outputs["words"], fail=fail, sleep_s=sleep_s)


@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.yaml"
    return compile_to_file(tiny, path)


def run_tiny(tiny_yaml, run_dir, *args):
    out = io.StringIO()
    result = run_local(str(tiny_yaml), list(args), run_dir, console=Console(file=out, width=200))
    return result, json.loads(result.index_path.read_text()), out.getvalue()


def test_steps_outputs_and_cache_hits(tiny_yaml, tmp_path):
    configure_logging(logging.INFO)
    result, index, out = run_tiny(tiny_yaml, tmp_path / "a", "count=3")
    assert result.status == RunStatus.SUCCEEDED, result.failed_log
    assert "▶ produce" in out and "✓ produce (" in out and "✓ consume (" in out
    produce_out = index["tasks"]["produce"]["outputs"]
    assert produce_out["Output"] == {"type": "NUMBER_INTEGER", "value": 3}
    assert Path(produce_out["words"]["path"]).read_text() == "w\nw\nw\n"
    assert index["tasks"]["consume"]["outputs"]["Output"]["value"] == "w\nw\nw"
    assert "producing 3" in (tmp_path / "a" / "run.log").read_text()

    again, index2, out2 = run_tiny(tiny_yaml, tmp_path / "b", "count=3")
    assert again.status == RunStatus.SUCCEEDED
    assert {t["status"] for t in index2["tasks"].values()} == {TaskStatus.CACHED}
    assert "✓ produce (cached)" in out2 and "▶" not in out2
    assert index2["tasks"]["produce"]["outputs"]["words"]["path"] == produce_out["words"]["path"]


def test_failed_step_keeps_its_own_output(tiny_yaml, tmp_path):
    configure_logging(logging.INFO)
    result, index, out = run_tiny(tiny_yaml, tmp_path / "f", "fail=true")
    assert result.status == RunStatus.FAILED and result.failed_task == "consume"
    assert "✗ consume failed" in out
    assert result.failure_reason == "ValueError: tasks.jsonl:3: malformed JSON"
    assert "line one of the step" in result.failed_log
    assert not any("Executing task" in line for line in result.failed_log)  # kfp's framing stays in run.log
    assert index["tasks"]["consume"]["status"] == "failed" and index["tasks"]["produce"]["status"] != "failed"
    note = index["tasks"]["consume"]["outputs"]["note"]  # what the failed step left behind
    assert note["partial"] and Path(note["path"]).read_text() == "written before any failure\n"
    assert "Executing task" in (tmp_path / "f" / "run.log").read_text()


def test_quiet_run_prints_nothing_and_debug_streams_the_log(tiny_yaml, tmp_path):
    configure_logging(logging.WARNING)
    _, _, quiet = run_tiny(tiny_yaml, tmp_path / "q", "count=5")
    assert quiet == ""
    configure_logging(logging.DEBUG)
    _, _, live = run_tiny(tiny_yaml, tmp_path / "d", "count=6")
    assert "producing 6" in live and "▶" not in live


def test_sigterm_interrupts_the_run_and_still_indexes_it(tiny_yaml, tmp_path):
    """`kill` (or a CI timeout) while `consume` runs: run.json is still written, saying what was cut off."""
    configure_logging(logging.INFO)
    log, stop = tmp_path / "i" / "run.log", threading.Event()

    def kill_when_consume_runs() -> None:
        while not stop.wait(0.1):
            if log.is_file() and "line one of the step" in log.read_text():
                os.kill(os.getpid(), signal.SIGTERM)
                return

    killer = threading.Thread(target=kill_when_consume_runs, daemon=True)
    killer.start()
    try:
        with pytest.raises(KeyboardInterrupt, match="partial results indexed"):
            run_tiny(tiny_yaml, tmp_path / "i", "sleep_s=8", "count=7")
    finally:
        stop.set()
        killer.join()
    index = json.loads((tmp_path / "i" / "run.json").read_text())
    assert index["status"] == "interrupted" and index["failed_task"] == "consume"
    assert index["tasks"]["consume"]["status"] == "interrupted"
    assert index["tasks"]["produce"]["status"] == "succeeded"


def test_heartbeat_for_long_steps():
    out = io.StringIO()
    record = TaskRecord("train-grpo", "comp-train-grpo")
    with StepLines(Console(file=out, width=200), every_s=0.05) as steps:
        steps.launched(record)
        time.sleep(0.3)
        record.status, record.seconds = TaskStatus.SUCCEEDED, 0.3
        steps.finished(record)
    assert "train-grpo running for" in out.getvalue() and "✓ train-grpo (0.3 s)" in out.getvalue()


def test_a_kfp_that_no_longer_has_what_is_observed_is_a_clear_error(monkeypatch):
    from kfp.local import cache, subprocess_task_handler
    from kfp.local.orchestrator import task_executor

    execute, get = task_executor.execute_single_task, cache.LocalCache.get
    run_step = subprocess_task_handler.run_local_subprocess
    monkeypatch.delattr(subprocess_task_handler, "run_local_subprocess")
    with pytest.raises(LocalRunError, match="run_local_subprocess is gone"):
        with TaskWatcher():
            pass
    assert task_executor.execute_single_task is execute and cache.LocalCache.get is get  # unwrapped again
    monkeypatch.setattr(subprocess_task_handler, "run_local_subprocess", run_step, raising=False)
    monkeypatch.setattr(task_executor, "execute_single_task", lambda name, spec: None)
    with pytest.raises(LocalRunError, match="execute_single_task is gone or takes other parameters"):
        with TaskWatcher():
            pass
