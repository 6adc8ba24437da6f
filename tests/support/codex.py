"""For tests that run the real Codex CLI: a skip marker naming why it cannot run here, and the scripted replies
(not a model) of a fix as Codex's tools take it: `exec_command` to view the file, `apply_patch` (Codex's own
edit format, which it runs itself when a command invokes it) to edit it, `exec_command` to run the tests. The
engine is tests/support/claude_code.py's `CliScriptEngine`."""

from __future__ import annotations

import pytest

from harnessrl.harness.cli_agents import CODEX, skip_reason
from tests.support.claude_code import call

_why = skip_reason(CODEX)
requires_codex = pytest.mark.skipif(_why is not None, reason=_why or "")


def apply_patch(path: str, old: str, new: str) -> str:
    """A command that edits one line with Codex's apply_patch (intercepted and run by the CLI itself)."""
    body = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
    return f"apply_patch <<'EOF'\n{body}EOF"


def fix_script(path: str, old: str, new: str) -> tuple[str, ...]:
    """View the file, replace `old` by `new` with apply_patch, run the tests, finish."""
    return (
        call("exec_command", "Let me look at the code.", cmd=f"sed -n 1,40p {path}"),
        call("exec_command", "I will fix the bug.", cmd=apply_patch(path, old, new)),
        call("exec_command", cmd="python -m pytest -q 2>&1 | tail -3"),
        "The bug is fixed and the tests pass.",
    )
