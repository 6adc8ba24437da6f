"""The editor tool against files an agent controls: huge files, symlink loops, FIFOs, files where a directory
should be. What it reads is streamed and capped, and every error the agent caused is an observation."""

from __future__ import annotations

import os
import threading
import tracemalloc

import pytest

from harnessrl.harness.runtime import VIEW_MAX_BYTES, VIEW_MAX_LINES, LocalSubprocessRuntime
from harnessrl.harness.tools import EDITOR, MalformedArguments, parse_arguments
from tests.support.fixtures import requires_bwrap
from tests.support.scripted_model import ScriptedModelServer


def editor(runtime, **args):
    return EDITOR.execute(parse_arguments(EDITOR, args), runtime, 10.0).content


def _peak_alloc(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("layout", ["lines", "one-line"])
def test_view_of_a_64mb_file_reads_a_bounded_slice(tmp_path, layout):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        if layout == "lines":
            row = b"y" * 99 + b"\n"
            f.write(row * ((64 << 20) // len(row)))
        else:
            f.truncate(64 << 20)  # 64 MB of NUL bytes and no newline at all
    runtime = LocalSubprocessRuntime(tmp_path)
    obs, peak = _peak_alloc(lambda: editor(runtime, command="view", path="big.txt"))
    assert isinstance(obs, str)
    assert peak < 4 << 20, f"view allocated {peak >> 20} MB for a 64 MB file"
    assert len(obs) < 2 * VIEW_MAX_BYTES
    if layout == "lines":
        assert "goes on after line" in obs and "view_range" in obs and str(big.stat().st_size) in obs
        shown = [ln for ln in obs.splitlines() if ln.strip()[:1].isdigit()]
        assert 0 < len(shown) <= VIEW_MAX_LINES
    else:
        assert "shown cut" in obs


def test_view_range_pages_through_a_file(tmp_path):
    (tmp_path / "f.py").write_text("".join(f"line {i}\n" for i in range(1, 5001)))
    runtime = LocalSubprocessRuntime(tmp_path)
    first = editor(runtime, command="view", path="f.py")
    last_shown = int(first.split("goes on after line ")[1].split()[0])
    page = editor(runtime, command="view", path="f.py", view_range=[last_shown + 1, last_shown + 3])
    assert page.splitlines()[:3] == [f"{n:6d}\tline {n}" for n in range(last_shown + 1, last_shown + 4)]
    tail = editor(runtime, command="view", path="f.py", view_range=[4999, -1])
    assert tail.splitlines() == ["  4999\tline 4999", "  5000\tline 5000"]
    with pytest.raises(MalformedArguments):
        parse_arguments(EDITOR, {"command": "view", "path": "f.py", "view_range": ["a", 2]})


def test_str_replace_refuses_a_file_too_large_to_read_whole(tmp_path):
    with open(tmp_path / "huge.py", "wb") as f:
        f.truncate(64 << 20)
    runtime = LocalSubprocessRuntime(tmp_path)
    obs, peak = _peak_alloc(
        lambda: editor(runtime, command="str_replace", path="huge.py", old_str="a", new_str="b")
    )
    assert isinstance(obs, str) and obs.startswith("Error:") and "larger than" in obs
    assert peak < 16 << 20


@pytest.mark.parametrize(
    "setup, args, expected",
    [
        (
            lambda d: (os.symlink("b", d / "a"), os.symlink("a", d / "b")),
            {"command": "view", "path": "a"},
            "loop",
        ),
        (
            lambda d: (d / "f").write_text("x"),
            {"command": "create", "path": "f/new.py", "file_text": "y"},
            "f/new.py",
        ),
        (lambda d: (d / "f").write_text("x"), {"command": "view", "path": "f/g"}, "f/g"),
        (lambda d: (d / "pkg").mkdir(), {"command": "view", "path": "pkg"}, "directory"),
        (lambda d: (d / "pkg").mkdir(), {"command": "create", "path": "pkg", "file_text": "y"}, "pkg"),
        (lambda d: os.symlink("/etc/passwd", d / "p"), {"command": "view", "path": "p"}, "outside"),
        (
            lambda d: (os.symlink("b", d / "a"), os.symlink("a", d / "b")),
            {"command": "str_replace", "path": "a", "old_str": "x", "new_str": "y"},
            "loop",
        ),
    ],
    ids=[
        "symlink-loop-view",
        "create-under-a-file",
        "view-under-a-file",
        "view-a-dir",
        "create-over-a-dir",
        "symlink-out",
        "symlink-loop-edit",
    ],
)
def test_errors_the_agent_caused_are_observations(tmp_path, setup, args, expected):
    setup(tmp_path)
    obs = editor(LocalSubprocessRuntime(tmp_path), **args)
    assert obs.startswith("Error:") and expected in obs, obs


@pytest.mark.parametrize(
    "args",
    [
        {"command": "view", "path": "pipe"},
        {"command": "create", "path": "pipe", "file_text": "x"},
        {"command": "str_replace", "path": "pipe", "old_str": "a", "new_str": "b"},
    ],
    ids=["view", "create", "str_replace"],
)
def test_a_fifo_never_blocks_the_harness(tmp_path, args):
    os.mkfifo(tmp_path / "pipe")
    out: dict[str, str] = {}
    runtime = LocalSubprocessRuntime(tmp_path)
    t = threading.Thread(target=lambda: out.update(obs=editor(runtime, **args)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # open the other end so the stuck thread can finish
        os.close(os.open(tmp_path / "pipe", os.O_RDWR | os.O_NONBLOCK))
        pytest.fail(f"{args['command']} on a FIFO blocked the harness")
    assert out["obs"].startswith("Error:"), out
    assert "regular file" in out["obs"] or "No such device" in out["obs"], out


@requires_bwrap
def test_an_episode_in_the_sandbox_goes_on_after_tool_errors(tmp_path):
    """The episode as a rollout runs it (ReAct harness, bubblewrap): errors the agent caused come back as
    observations and the episode still ends `ok` (scored), never `harness_error` (excluded)."""
    from harnessrl.harness.base import Endpoint, TaskPrompt
    from harnessrl.harness.react import ReActConfig, ReActHarness
    from harnessrl.harness.runtime import SandboxRuntime
    from harnessrl.sandbox.bwrap import BubblewrapSandbox

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text("x = 1\n")

    def call(tool, **arguments):
        return {"tool": tool, "arguments": arguments}

    script = [
        call("bash", command="ln -s b a && ln -s a b && mkfifo pipe"),
        call("str_replace_editor", command="view", path="a"),
        call("str_replace_editor", command="create", path="calc.py/sub.py", file_text="y"),
        call("str_replace_editor", command="view", path="pipe"),
        call("str_replace_editor", command="create", path="notes/todo.txt", file_text="one\n"),
        call("bash", command="echo two >> notes/todo.txt && touch notes/more && cat notes/todo.txt"),
        {"tool": "submit", "arguments": {}},
    ]
    server = ScriptedModelServer(script)
    url = server.start()
    try:
        with BubblewrapSandbox(ws) as sandbox:
            res = ReActHarness(ReActConfig(http_retries=0)).run(
                TaskPrompt("t", "fix it"), Endpoint(url, "k"), SandboxRuntime(sandbox, ws)
            )
    finally:
        server.stop()
    assert (res.status, res.finish_reason) == ("ok", "submitted"), res.error
    observations = [m["content"] for m in res.transcript if m["role"] == "tool"]
    assert observations[1].startswith("Error:") and "loop" in observations[1]
    assert observations[2].startswith("Error:") and "calc.py/sub.py" in observations[2]
    assert observations[3].startswith("Error:") and "regular file" in observations[3]
    # a file the harness wrote on the host stays editable by the sandboxed agent
    assert "<returncode>0" in observations[5] and "one\ntwo" in observations[5]
    assert (ws / "notes" / "todo.txt").read_text() == "one\ntwo\n"
