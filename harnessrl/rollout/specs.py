"""Per-sample harness specs: parse, validate, assign to rollouts, and build the harness + sandbox they name.

A spec file is JSON: one `HarnessSpec` object or a list of them (fields: harness, tools, sandbox, network,
reward, limits, options; plus an optional `name`). Rollout k of task i (global index g = i * group_size + k) gets
spec[g % len(specs)], so a list of two specs mixes them inside every group.

    harness   HarnessName: react | mini-swe-agent
    sandbox   SandboxKind: bubblewrap (workspace = one-commit git repo) | bubblewrap-strict (no .git; git
              refuses) | podman (one container from the task's image_name) | kubernetes (one pod from the
              task's image_name, commands via exec) | local (no isolation: only with allow_unsandboxed)
    network   podman / kubernetes only: a named egress allow-list (e.g. a package-index proxy); default none
    reward    RewardName: swebench | f2p_fraction (recorded as the rollout's reward_fn; verify scores with it)
    limits    turns, tokens, wall_s (harness);  memory_mb, processes, cpu_s, file_size_mb, tmp_mb (sandbox);
              tool_timeout_s (per command)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.harness.base import Harness
from harnessrl.schema import HarnessName, HarnessSpec, RewardName, SandboxKind

HARNESS_LIMITS = ("turns", "tokens", "wall_s", "tool_timeout_s")
SANDBOX_LIMITS = ("memory_mb", "processes", "cpu_s", "file_size_mb", "tmp_mb")


@dataclass(frozen=True)
class NamedSpec:
    name: str
    spec: HarnessSpec

    def to_row(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self.spec)}


def parse_specs(raw: Any, where: str = "harness spec") -> list[NamedSpec]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ValueError(f"{where}: empty list; give at least one harness spec")
    allowed = {f.name for f in fields(HarnessSpec)} | {"name"}
    out = []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{here}: expected an object with fields {sorted(allowed)}")
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise ValueError(f"{here}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        kw = {k: v for k, v in item.items() if k != "name"}
        kw["harness"] = parse_choice(HarnessName, kw.get("harness", HarnessName.REACT), f"{here}.harness")
        kw["sandbox"] = parse_choice(
            SandboxKind, kw.get("sandbox", SandboxKind.BUBBLEWRAP), f"{here}.sandbox"
        )
        kw["reward"] = parse_choice(RewardName, kw.get("reward", RewardName.SWEBENCH), f"{here}.reward")
        spec = HarnessSpec(**kw)
        if "limits" in item:  # partial limits extend the defaults
            spec.limits = {**HarnessSpec().limits, **item["limits"]}
        if spec.network is not None and spec.sandbox not in (SandboxKind.PODMAN, SandboxKind.KUBERNETES):
            raise ValueError(f"{here}.network: only sandbox podman or kubernetes has a network")
        validate_spec(spec, here)
        out.append(NamedSpec(str(item.get("name") or f"{spec.harness}/{spec.sandbox}#{i}"), spec))
    return out


def validate_spec(spec: HarnessSpec, where: str) -> None:
    unknown = sorted(set(spec.limits) - set(HARNESS_LIMITS) - set(SANDBOX_LIMITS))
    if unknown:
        raise ValueError(
            f"{where}.limits: unknown key(s) {unknown}; allowed: {list(HARNESS_LIMITS + SANDBOX_LIMITS)}"
        )
    try:
        build_harness(spec)  # option names and values are checked by the harness's own config
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_specs(path: str | Path | None) -> list[NamedSpec]:
    if path is None:
        return parse_specs({}, "default harness spec")
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return parse_specs(raw, str(path))


def assign(specs: list[NamedSpec], task_index: int, sample_index: int, group_size: int) -> NamedSpec:
    return specs[(task_index * group_size + sample_index) % len(specs)]


def build_harness(spec: HarnessSpec, seed: int | None = None) -> Harness:
    """`seed` (per rollout) applies unless the spec's options set one."""
    limits = spec.limits
    if spec.harness is HarnessName.REACT:
        from harnessrl.harness.react import ReActConfig, ReActHarness

        options = dict(spec.options)
        if seed is not None:
            options.setdefault("seed", seed)
        if "tool_timeout_s" in limits:
            options.setdefault("tool_timeout_s", float(limits["tool_timeout_s"]))
        return ReActHarness(ReActConfig.from_spec(spec.tools, limits, options))
    if spec.harness is HarnessName.MINI_SWE_AGENT:
        from harnessrl.harness.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness

        options = dict(spec.options)
        if seed is not None:
            options.setdefault("seed", seed)
        if "tool_timeout_s" in limits:
            options.setdefault("tool_timeout_s", float(limits["tool_timeout_s"]))
        return MiniSweAgentHarness(MiniSweAgentConfig.from_spec(limits, options))
    raise ValueError(f"unknown harness {spec.harness!r}")


def sandbox_limits(spec: HarnessSpec) -> dict[str, int]:
    return {k: int(v) for k, v in spec.limits.items() if k in SANDBOX_LIMITS}
