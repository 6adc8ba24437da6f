"""The project image: both Dockerfiles are well-formed (the GPU one is only built on a cluster), and a
pipeline stage's CLI runs inside the cpu image built here (`make image`) on a real task set."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from harnessrl.harness.cli_agents import CLAUDE_CODE, CLAUDE_CODE_VERSION, CODEX, CODEX_VERSION, skip_reason
from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet
from tests.sandbox.podman_fixtures import requires_podman

ROOT = Path(__file__).parents[2]
INSTRUCTIONS = {
    "FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE",
    "VOLUME", "SHELL", "HEALTHCHECK", "ONBUILD", "STOPSIGNAL",
}  # fmt: skip


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: comments dropped, `\\` continuations joined."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    assert not pending, f"{path}: the file ends inside a continued line"
    return out


def problems(path: Path) -> list[str]:
    found, stages, args = [], [], set()
    steps = instructions(path)
    if not steps or steps[0][0] not in ("FROM", "ARG"):
        found.append("must start with ARG or FROM")
    for word, rest in steps:
        if word not in INSTRUCTIONS:
            found.append(f"unknown instruction {word}")
        elif word == "ARG":
            args.add(rest.split("=")[0])
        elif word == "FROM":
            for ref in re.findall(r"\$\{?(\w+)", rest):
                if ref not in args:
                    found.append(f"FROM uses undeclared ARG {ref}")
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            if m is None:
                found.append(f"bad FROM {rest!r}")
            elif m.group(2):
                stages.append(m.group(2))
        elif word in ("ENTRYPOINT", "CMD") and rest.startswith("["):
            json.loads(rest)
        elif word == "COPY" and "--from" not in rest:
            for src in rest.split()[:-1]:
                if not src.startswith("--") and not (ROOT / src).exists() and not src.startswith("build/"):
                    found.append(f"COPY source {src} is not in the repo")
        if word == "RUN":
            for source in re.findall(r"--mount=type=bind,source=([^,\s]+)", rest):
                if (ROOT / source).resolve() != images.WHEELHOUSE:
                    found.append(f"RUN binds {source}, not the wheelhouse")
    if len(stages) != len(set(stages)):
        found.append(f"duplicate stage names {stages}")
    if not any(w == "FROM" for w, _ in steps):
        found.append("no FROM")
    return found


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_are_well_formed(name):
    path = ROOT / "manifests" / "image" / name
    assert problems(path) == []
    stages = [r.split()[-1] for w, r in instructions(path) if w == "FROM" and " AS " in r.upper()]
    if name == "Dockerfile":  # what images.build_project builds: --target app, --build-arg DEPS=deps-<target>
        assert stages == [*(f"deps-{t}" for t in images.ImageTarget), "app", "agents"]


def test_the_checker_catches_what_it_claims(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ${NOPE}\nRUN echo a \\\n  && echo b\nFROOM x\nCOPY no/such/dir /x\n")
    assert problems(bad) == [
        "FROM uses undeclared ARG NOPE",
        "unknown instruction FROOM",
        "COPY source no/such/dir is not in the repo",
    ]


@requires_podman
@pytest.mark.slow
def test_a_stage_cli_runs_in_the_project_image(project_image, synth_taskset, tmp_path):
    """`harnessrl stage clean` in the image, as its non-root user, on a task set bound read-only."""
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1000, 1000)
    proc = subprocess.run(
        [
            *("podman", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp"),
            *("--mount", f"type=bind,src={synth_taskset},dst=/in,ro"),
            *("--mount", f"type=bind,src={out},dst=/out"),
            project_image,
            *("harnessrl", "stage", "clean", "--tasks", "/in", "--out", "/out/clean"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = TaskSet.open(out / "clean" / "kept").rows()
    assert [r["instance_id"] for r in kept] == [r["instance_id"] for r in TaskSet.open(synth_taskset).rows()]
    assert json.loads((out / "clean" / "metrics.json").read_text())["rows_kept"] == len(kept)


@requires_podman
@pytest.mark.skipif(
    bool(skip_reason(CLAUDE_CODE) or skip_reason(CODEX)), reason="the pinned CLIs: make cli-agents"
)
def test_the_agent_image_holds_the_pinned_clis_where_rollout_workers_look(project_image):
    """`images project --with-cli-agents`: the project image plus both pinned CLIs at the paths `cli_agents`
    resolves inside it (HARNESSRL_CACHE=/opt/harnessrl), runnable there without a network — what a Kubernetes
    sandbox pod's init container copies and a rollout worker requires."""
    image = images.build_project(with_cli_agents=True)
    assert image == f"{project_image}-agents"
    script = (
        "import subprocess; from harnessrl.harness.cli_agents import PINNED, require\n"
        "for name in sorted(PINNED):\n"
        "    cli = require(name)\n"
        "    out = subprocess.run([cli.executable, '--version'], capture_output=True, text=True).stdout\n"
        "    print(name, cli.prefix, out.strip())\n"
    )
    proc = subprocess.run(
        ["podman", "run", "--rm", "--network", "none", "--read-only", image, "python", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines == [
        f"claude-code /opt/harnessrl/cli/claude-code-{CLAUDE_CODE_VERSION} {CLAUDE_CODE_VERSION} (Claude Code)",
        f"codex /opt/harnessrl/cli/codex-{CODEX_VERSION} codex-cli {CODEX_VERSION}",
    ], lines
