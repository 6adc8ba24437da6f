"""Per-sample harness specs: parse, validate, assign to rollouts, and build the harness + sandbox they name.

A spec file is JSON: one `HarnessSpec` object or a list of them (fields: harness, tools, sandbox, network,
reward, limits, options; plus an optional `name` and `environments`). Rollout k of task i (global index g =
i * group_size + k) gets spec[g % len(specs)] of the specs for the task's environment, so a list of two
specs mixes them inside every group; the RL loop's `spec_mix: group` deals them per group instead (SpecMix).

    harness   HarnessName: react | mini-swe-agent | claude-code | codex (the real CLIs inside the rollout's
              sandbox: bubblewrap, podman or a Kubernetes pod)
    sandbox   SandboxKind: bubblewrap (workspace = one-commit git repo) | bubblewrap-strict (no .git; git
              refuses) | podman (one container from the task's image_name) | kubernetes (one pod from the
              task's image_name, commands via exec) | local (no isolation: only with allow_unsandboxed)
    network   podman / kubernetes only: a named egress allow-list (e.g. a package-index proxy); default none
    reward    "" (the task's environment's default), one its environment offers (swe: swebench | f2p_fraction;
              instruction: instruction_fraction | instruction_strict | instruction_loose; kernel: kernel_partial
              | kernel_solved; search: search_em | search_f1; procedural: procedural_exact |
              procedural_tagged), or a custom 'module:function' (recorded as the rollout's reward_fn; verify
              scores with it)
    environments  the task environments the spec is for (default: every one); a task set that mixes
              environments gives each its own specs, and a task no spec is for runs under its environment's
              default spec (rollout.episode.spec_for)
    limits    turns, tokens, wall_s (harness);  memory_mb, processes, cpu_s, file_size_mb, tmp_mb (sandbox);
              tool_timeout_s (per command); reply_tokens (every harness: each model call samples at most this
              many tokens, whatever the harness asks; the gateway ends the reply with its API's ordinary
              length stop: `finish_reason: length`, Anthropic `stop_reason: max_tokens`, Responses
              `incomplete`); context_tokens (every harness: the rollout's context window, prompt + reply of
              each call, below the engine's; a call whose prompt fills it gets its API's context-full answer —
              Anthropic's `prompt is too long`, Responses' `context_length_exceeded`, an empty chat reply cut
              for length); what a spec leaves out is its harness's default (DEFAULT_LIMITS; chat: a reply
              of at most 256 tokens), else turns 20, tokens 8192, wall_s 600, no reply_tokens
    train_chains  all (default: every chain of a rollout is a sample) | main (only the chain its first call
              started; a CLI agent's subagents, compaction and side calls are left out of training)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.gateway.enums import TrainChains
from harnessrl.harness.base import GATEWAY_LIMITS, LIMIT_TYPES, Harness, SpecConfig
from harnessrl.rollout.fit import check_spec
from harnessrl.schema import HarnessName, HarnessSpec, SandboxKind, SpecMix

SANDBOX_LIMITS = ("memory_mb", "processes", "cpu_s", "file_size_mb", "tmp_mb")
# The harness limits: each harness's config says which it honours (its LIMITS), the gateway's (`reply_tokens`,
# `context_tokens`) every one (the gateway holds its calls to them). A spec that gives one its harness does not
# use is refused, with what the harness does instead.
HARNESS_LIMITS = tuple(sorted(LIMIT_TYPES))
_INSTEAD = {
    "tokens": "its context is the gateway's: a window per rollout is context_tokens, per model call reply_tokens",
    "turns": "it answers in one model call",
    "tool_timeout_s": "chat runs no commands; a CLI runs its own, under the sandbox's wall_s",
}
# The limits a spec that names none gets, where HarnessSpec's (a tool loop's 8,192-token context) would stall a
# run: `chat`'s `tokens` is its reply budget, and the tiny model rarely stops on its own (a reply of up to
# 8,192 tokens left one instruction run at one reply in 10 minutes).
DEFAULT_LIMITS: dict[HarnessName, dict[str, int]] = {HarnessName.CHAT: {"tokens": 256, "wall_s": 600}}


@dataclass(frozen=True)
class NamedSpec:
    name: str
    spec: HarnessSpec
    environments: tuple[str, ...] = ()  # the environments the spec is for (none: every one)

    def to_row(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self.spec)}


def parse_specs(raw: Any, where: str = "harness spec") -> list[NamedSpec]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ValueError(f"{where}: empty list; give at least one harness spec")
    allowed = {f.name for f in fields(HarnessSpec)} | {"name", "environments"}
    out = []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{here}: expected an object with fields {sorted(allowed)}")
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise ValueError(f"{here}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        kw = {k: v for k, v in item.items() if k not in ("name", "environments")}
        environments = item.get("environments", [])
        if not isinstance(environments, list) or not all(isinstance(e, str) and e for e in environments):
            raise ValueError(
                f"{here}.environments: expected a list of environment names, got {environments!r}"
            )
        from harnessrl.environments.registry import builtin_names

        unknown_envs = [e for e in environments if ":" not in e and e not in builtin_names()]
        if unknown_envs:
            raise ValueError(
                f"{here}.environments: unknown environment(s) {unknown_envs}; built-in: "
                f"{', '.join(builtin_names())}, or 'module:attribute'"
            )
        kw["harness"] = parse_choice(HarnessName, kw.get("harness", HarnessName.REACT), f"{here}.harness")
        kw["sandbox"] = parse_choice(
            SandboxKind, kw.get("sandbox", SandboxKind.BUBBLEWRAP), f"{here}.sandbox"
        )
        kw["reward"] = parse_reward(kw.get("reward", ""), f"{here}.reward")
        kw["train_chains"] = parse_choice(
            TrainChains, kw.get("train_chains", TrainChains.ALL), f"{here}.train_chains"
        ).value
        spec = HarnessSpec(**kw)
        given = item.get("limits", {})
        if not isinstance(given, dict):
            raise ValueError(f"{here}.limits: expected an object of limit -> number, got {given!r}")
        honoured = honoured_limits(spec.harness)
        if unused := sorted(set(given) & set(HARNESS_LIMITS) - honoured):
            key = unused[0]
            raise ValueError(
                f"{here}.limits.{key}: harness {spec.harness} does not use it ({_INSTEAD[key]}); it uses "
                f"{', '.join(sorted(honoured))}"
            )
        # partial limits extend the harness's defaults
        spec.limits = {**DEFAULT_LIMITS.get(spec.harness, HarnessSpec().limits), **item.get("limits", {})}
        if spec.network is not None and spec.sandbox not in (SandboxKind.PODMAN, SandboxKind.KUBERNETES):
            raise ValueError(f"{here}.network: only sandbox podman or kubernetes has a network")
        check_spec(spec, here)
        validate_spec(spec, here)
        name = str(item.get("name") or f"{spec.harness}/{spec.sandbox}#{i}")
        out.append(NamedSpec(name, spec, tuple(environments)))
    return out


def parse_reward(value: object, where: str) -> str:
    """A spec's `reward`: "" (the environment's default), a reward an environment offers, or a custom
    function's import path `module:function` (checked when a task meets the spec: environments.registry)."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    if value and ":" not in value:
        from harnessrl.environments.registry import builtin_reward_names

        known = builtin_reward_names()
        if value not in known:
            raise ValueError(
                f"{where}: unknown reward {value!r}; one of {', '.join(known)}, or 'module:function' for your own"
            )
    return value


def validate_spec(spec: HarnessSpec, where: str) -> None:
    unknown = sorted(set(spec.limits) - set(HARNESS_LIMITS) - set(SANDBOX_LIMITS))
    if unknown:
        raise ValueError(
            f"{where}.limits: unknown key(s) {unknown}; allowed: {list(HARNESS_LIMITS + SANDBOX_LIMITS)}"
        )
    for key, what in zip(GATEWAY_LIMITS, ("tokens per model call", "prompt + reply tokens"), strict=True):
        value = spec.limits.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{where}.limits.{key}: expected an integer >= 1 ({what}), got {value!r}")
    try:
        build_harness(spec)  # option names and values are checked by the harness's own config
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_specs(path: str | Path | None) -> list[NamedSpec]:
    """A spec file, or the JSON itself (`--specs '[{"harness": "claude-code"}]'`); none (`[]`) without
    either: each task then runs under its environment's default spec (rollout.episode.spec_for)."""
    if path is None:
        return []
    if isinstance(path, str) and path.lstrip()[:1] in ("[", "{"):
        try:
            return parse_specs(json.loads(path), "--specs")
        except json.JSONDecodeError as e:
            raise ValueError(f"--specs: not valid JSON ({e.msg} at column {e.colno})") from None
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return parse_specs(raw, str(path))


def assign(
    specs: list[NamedSpec], position: int, sample_index: int, group_size: int, mix: SpecMix = SpecMix.SAMPLE
) -> NamedSpec:
    """The spec of rollout `sample_index` of the group at `position` (a task's index, or the RL loop's group
    position under SpecMix.GROUP)."""
    if mix is SpecMix.GROUP:
        return specs[position % len(specs)]
    return specs[(position * group_size + sample_index) % len(specs)]


def config_class(harness: HarnessName) -> type[SpecConfig]:
    """The config a spec of `harness` builds (imported on first use: the harness libraries are heavy)."""
    if harness is HarnessName.REACT:
        from harnessrl.harness.react import ReActConfig

        return ReActConfig
    if harness is HarnessName.MINI_SWE_AGENT:
        from harnessrl.harness.mini_swe_agent import MiniSweAgentConfig

        return MiniSweAgentConfig
    if harness is HarnessName.CHAT:
        from harnessrl.harness.chat import ChatConfig

        return ChatConfig
    if harness is HarnessName.CLAUDE_CODE:
        from harnessrl.harness.claude_code import ClaudeCodeConfig

        return ClaudeCodeConfig
    if harness is HarnessName.CODEX:
        from harnessrl.harness.codex import CodexConfig

        return CodexConfig
    raise ValueError(f"unknown harness {harness!r}")


def honoured_limits(harness: HarnessName) -> frozenset[str]:
    return frozenset(config_class(harness).LIMITS) | set(GATEWAY_LIMITS)


def build_harness(spec: HarnessSpec, seed: int | None = None) -> Harness:
    """`seed` (per rollout) applies unless the spec's options set one (the CLIs send none)."""
    limits, options = spec.limits, dict(spec.options)
    if seed is not None and spec.harness not in (HarnessName.CLAUDE_CODE, HarnessName.CODEX):
        options.setdefault("seed", seed)
    if spec.harness is HarnessName.REACT:
        from harnessrl.harness.react import ReActConfig, ReActHarness

        return ReActHarness(ReActConfig.from_spec(spec.tools, limits, options))
    if spec.harness is HarnessName.MINI_SWE_AGENT:
        from harnessrl.harness.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness

        return MiniSweAgentHarness(MiniSweAgentConfig.from_spec(limits, options))
    if spec.harness is HarnessName.CHAT:
        from harnessrl.harness.chat import ChatConfig, ChatHarness

        return ChatHarness(ChatConfig.from_spec(limits, options))
    if spec.harness is HarnessName.CLAUDE_CODE:
        from harnessrl.harness.claude_code import ClaudeCodeConfig, ClaudeCodeHarness

        return ClaudeCodeHarness(ClaudeCodeConfig.from_spec(limits, options))
    if spec.harness is HarnessName.CODEX:
        from harnessrl.harness.codex import CodexConfig, CodexHarness

        return CodexHarness(CodexConfig.from_spec(limits, options))
    raise ValueError(f"unknown harness {spec.harness!r}")


def sandbox_limits(spec: HarnessSpec) -> dict[str, int]:
    return {k: int(v) for k, v in spec.limits.items() if k in SANDBOX_LIMITS}
