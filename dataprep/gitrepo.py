"""Git plumbing for SWE-smith-layout repositories: a squashed `main`, task branches, bundles."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "harnessrl",
    "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
    "GIT_COMMITTER_NAME": "harnessrl",
    "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
}


class GitError(RuntimeError):
    pass


def git(repo: Path, *args: str, date: str | None = None, input: bytes | None = None) -> str:
    """Runs git in `repo` with a fixed identity (and date), ignoring the user's global config and hooks."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env.update(IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    cmd = [
        "git",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "init.defaultBranch=main",
        "-c",
        "core.autocrlf=false",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=repo, env=env, input=input, capture_output=True)
    if proc.returncode != 0:
        raise GitError(
            f"`git {' '.join(args)}` in {repo} failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode("utf-8", errors="replace")


def init_squashed(repo: Path, date: str) -> str:
    """Turns the directory into a repository whose `main` is one commit "Initial commit"; returns its sha."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Initial commit", date=date)
    return git(repo, "rev-parse", "HEAD").strip()


def bundle_heads(bundle: Path) -> set[str]:
    """Branch names in a bundle (one `git bundle list-heads`, no clone)."""
    out = git(bundle.parent, "bundle", "list-heads", str(bundle.resolve()))
    heads = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].startswith("refs/heads/"):
            heads.add(parts[1][len("refs/heads/") :])
    return heads


def create_bundle(repo: Path, out: Path) -> Path:
    git(repo, "bundle", "create", "-q", str(out.resolve()), "--all")
    return out
