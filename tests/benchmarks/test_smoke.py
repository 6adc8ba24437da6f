"""Every script in benchmarks/ runs its default code path at its smallest (`--smoke`) and ends with the one JSON
object it documents.

Each script runs as users run it (`python benchmarks/NAME.py --smoke`, a fresh process from the repository
root); the test checks its exit status and that its last stdout line is a JSON object holding the headline keys
of its docstring (the README's benchmark table). The scripts are found in the folder, so a new script without
`--smoke`, or without a row in `HEADLINES`, fails here. Timings are never asserted: a smoke run's figures mean
nothing. The rows marked slow take more than ~30 s on 2 busy cores (the real tiny model in several processes or
stages). The scripts run two at a time (SMOKE_WORKERS), the slow ones first: the whole file took 7.7 minutes on
a slow 2-core host (14.3 one at a time), `-m "not slow"` about one. Each run's own wall time is in the test's
report (junit property `smoke_seconds`): on a fresh clone's `make test`, the slowest multinode.py (427 s),
train.py (269 s), learning_harness.py (207 s), the other worker's modules beside them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.demo_steps import BASELINE_REV
from benchmarks.gpu_check import skip_reason
from harnessrl.harness.cli_agents import skip_reason as cli_skip_reason
from harnessrl.sandbox.images import podman_problem

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
TIMEOUT_S = 600  # a hung script fails its test instead of stalling the suite
# two scripts at a time: most of a smoke run is one core's work (process starts, imports, a 1-thread model)
SMOKE_WORKERS = 2


@dataclass(frozen=True)
class Headline:
    keys: frozenset[str]  # what the script's docstring promises on its last line
    slow: bool = False
    bwrap: bool = False  # rollouts or verification run in bubblewrap sandboxes
    git_rev: str | None = None  # a commit of this repository's history the script checks out
    clis: tuple[str, ...] = ()  # the CLI agents it runs (make cli-agents)
    # values its smoke run must print: outcomes of real processes it checks (a fault survived), never a timing
    holds: tuple[tuple[str, object], ...] = ()


def headline(
    *keys: str,
    slow: bool = False,
    bwrap: bool = False,
    git_rev: str | None = None,
    clis: tuple[str, ...] = (),
    holds: dict[str, object] | None = None,
) -> Headline:
    return Headline(frozenset(keys), slow, bwrap, git_rev, clis, tuple((holds or {}).items()))


HEADLINES: dict[str, Headline] = {
    "ablation_rollout_level.py": headline(
        *(f"{s}_{key}" for s in "abc" for key in ("heldout_mean", "ci_low", "ci_high", "entropy_growth")),
        "samples_per_rollout_mean",
        "single_sample_share",
        "minutes",
        slow=True,
    ),
    "async_sim.py": headline(
        "colocated_time_ratio_vs_sync",
        "separate_switch_throughput_vs_sync",
        "separate_switch_throughput_vs_fixed_async",
        "targets_met",
        "mechanisms",
        "workloads",
    ),
    "clean.py": headline("rows", "seconds", "peak_rss_mb", "kept", "rejected", "planted_rejections_match"),
    "demo_steps.py": headline(
        "difficulty_step_speedup",
        "generate_speedup",
        "model_s_per_turn_speedup",
        "rollouts_per_hour_speedup",
        "same_settings_step_speedup",
        "same_settings_model_s_per_turn_speedup",
        "loads",
        slow=True,
        bwrap=True,
        git_rev=BASELINE_REV,
    ),
    "engine.py": headline(
        "prefix_cache_speedup",
        "cache_hit_rate",
        "identical_agentic_outputs",
        "prefill_flops_fraction",
        "decode_flops_fraction",
        "decode_bandwidth_fraction",
        "decode_step_ms",
        "decode_tokens_per_row_step",
        "speculative_speedup",
        "batched_speedup",
        "identical_greedy_outputs",
        "bf16_vs_fp32_tokens_per_s",
        "flops_fraction_float32",
        "flops_fraction_bfloat16",
        "identical_greedy_fp32_bf16",
        "bf16_logprob_gap_fp32",
        "tis_weight_mean_fp32",
        "auto_engine_dtype",
        "auto_engine_bf16_factor",
        "load_before",
        "load_after",
        slow=True,
    ),
    "engine_layout.py": headline(
        "probed_vs_transposed_decode_ratio",
        "probed_vs_plain_decode_ratio",
        "decode_tokens_per_s",
        "picks_layer0_and_head",
        "identical_outputs",
    ),
    "engine_vs_vllm.py": headline(  # without vLLM: the vLLM figures null, `vllm_unavailable` says why
        "local_vs_vllm_decode_tokens_per_s_ratio",
        "local_vs_vllm_turn_time_ratio",
        "local_turn_s",
        "vllm_turn_s",
        "local_decode_tokens_per_s",
        "vllm_decode_tokens_per_s",
        "local_prefix_hit_rate",
        "vllm_prefix_hit_rate",
        "identical_agentic_outputs",
        "identical_batch_outputs",
        "max_logprob_diff",
        "vllm_unavailable",
        slow=True,
    ),
    "gateway.py": headline(
        "throughput_ratio_c64",
        "p99_added_ms_c64",
        "throughput_ratio_c64_staggered",
        "p99_added_ms_c64_staggered",
        "cpu_ratio_128k_vs_1k",
    ),
    "gpu_check.py": headline("ok", "phases", "seconds"),
    "harness_overhead.py": headline(
        "startup_s",
        "overhead_s_per_turn",
        "model_s_per_turn",
        "first_prompt_tokens",
        "journal_bytes_per_call_1k",
        "journal_bytes_per_call_30k",
        bwrap=True,
    ),  # without a GPU: one skip line instead
    "grading.py": headline("grading_agreement", "swebench_reward_agreement", "cases", "agreement_by_finding"),
    "learning_check.py": headline("heldout_reward_base", "heldout_reward_trained", "heldout_gain"),
    "learning_harness.py": headline(  # --smoke: trained through mixed only, evaluated through every harness
        *(
            f"mixed__{h}_{key}"
            for h in ("chat", "react", "claude-code", "codex")
            for key in ("diff", "ci_low")
        ),
        "rollout_stats",
        "minutes",
        slow=True,
        bwrap=True,
        clis=("claude-code", "codex"),
    ),
    "learning_envs.py": headline(
        *(
            f"{env}_{key}"
            for env in ("instruction", "swe", "kernel", "search", "procedural")
            for key in ("base", "trained", "ci_low")
        ),
        "minutes",
        slow=True,
        bwrap=True,
    ),
    "learning_swe.py": headline(
        "toolcall_rate_base",
        "toolcall_rate_sft",
        "pass1_base",
        "pass1_sft",
        "pass1_rl",
        "pass1_rl_ci_low",
        "heldout_pass1_base",
        "heldout_pass1_sft",
        "heldout_pass1_rl",
        slow=True,
        bwrap=True,
    ),
    "lora.py": headline(
        "full_diff",
        "full_ci_low",
        "lora_diff",
        "lora_ci_low",
        "trainer_peak_rss_ratio",
        "sync_bytes_ratio",
        "sync_seconds_ratio",
        "step_time_ratio",
        "minutes",
        slow=True,
    ),
    "make_swesmith_rows.py": headline("rows", "repos", "expected_rejections", "expected_rejected_rows"),
    "multinode.py": headline(
        "nodes",
        "steps",
        "weights_match_single_node",
        "worker_node_killed_recovered",
        "engine_killed_recovered",
        "trainer_rank_killed_resumed",
        "lost_groups",
        "minutes",
        slow=True,
        holds={"worker_node_killed_recovered": True, "trainer_rank_killed_resumed": True, "lost_groups": 0},
    ),
    "rl_modes.py": headline(
        "colocated_wall_ratio_vs_sync",
        "separate_wall_ratio_vs_sync",
        "reward_gain_colocated",
        "calibration",
        slow=True,
    ),
    "rollout.py": headline(
        "rollouts_per_hour",
        "model_s_per_turn",
        "prefix_cache_rollouts_speedup",
        "overhead_s_per_turn",
        "overhead_vs_model",
        "ray_vs_threads_throughput",
        slow=True,
        bwrap=True,
    ),
    "router.py": headline(
        "makespan_ratio_cache_aware_vs_least_inflight", "prefill_ratio_cache_aware_vs_least_inflight"
    ),
    "store.py": headline("resume_bytes_ratio", "resume_time_ratio", "upload_time_ratio_vs_5mib"),
    "train.py": headline(
        "packed_speedup",
        "padding_fraction_packed",
        "padding_fraction_padded",
        "peak_rss_mb",
        "bf16_vs_fp32_tokens_per_s",
        "matmul_fraction_fp32",
        "matmul_fraction_bf16",
        "auto_precision",
        "auto_bf16_factor",
        "shared_prefix_step_speedup",
        "shared_prefix_token_ratio",
        slow=True,
    ),
    "verify.py": headline(
        "overhead_ratio", "sandbox_ratio", "verifications_per_min", "load_avg", slow=True, bwrap=True
    ),
    "weight_sync.py": headline(
        "checkpoint_s",
        "broadcast_s",
        "broadcast_vs_checkpoint",
        "join_s",
        "adapter_broadcast_s",
        "adapter_bytes",
    ),
}
# with podman here, verify.py measures the podman backend as well (the README's `overhead_ratio_podman`)
PODMAN_KEYS = frozenset({"overhead_ratio_podman", "podman_sandbox_ratio"})


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py"))


def _param(name: str) -> object:
    row = HEADLINES.get(name)
    return pytest.param(name, marks=[pytest.mark.slow] if row is not None and row.slow else [], id=name)


def _has_commit(rev: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True, check=False
    )
    return done.returncode == 0


def _skip_reason(row: Headline) -> str | None:
    if row.bwrap and shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) not installed"
    if row.git_rev is not None and not _has_commit(row.git_rev):
        return f"commit {row.git_rev} is not in this clone's history (a shallow clone: git fetch --unshallow)"
    return next((why for cli in row.clis if (why := cli_skip_reason(cli)) is not None), None)


def test_every_table_row_names_a_script():
    assert sorted(HEADLINES) == _scripts(), "HEADLINES must list exactly the scripts in benchmarks/"


@dataclass(frozen=True)
class SmokeRun:
    done: subprocess.CompletedProcess[str]
    seconds: float  # its own wall time: recorded in the test's report (junit `smoke_seconds`), never asserted


def _smoke(name: str) -> SmokeRun:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return SmokeRun(done, time.monotonic() - started)


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, Future[SmokeRun]]]:
    """The selected scripts' smoke runs, SMOKE_WORKERS at a time from the first test on, the slow rows first;
    each test waits for its own. Under `make test` the other worker runs other modules meanwhile."""
    selected = [
        str(item.callspec.params["name"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_smoke_run_ends_with_its_headline_json"
        and item.path == request.path
    ]
    runnable = [n for n in selected if (row := HEADLINES.get(n)) is not None and _skip_reason(row) is None]
    runnable.sort(key=lambda n: not HEADLINES[n].slow)
    with ThreadPoolExecutor(SMOKE_WORKERS) as pool:
        runs = {name: pool.submit(_smoke, name) for name in runnable}
        yield runs
        for run in runs.values():
            run.cancel()


# the first test waits for the slow rows ahead of it in the pool (~7 min on a slow host): past pytest's 900 s
@pytest.mark.timeout(3 * TIMEOUT_S)
@pytest.mark.parametrize("name", [_param(n) for n in _scripts()])
def test_smoke_run_ends_with_its_headline_json(name: str, smoke_runs, record_property):
    row = HEADLINES.get(name)
    assert row is not None, f"benchmarks/{name} has no row in HEADLINES: add its documented last-line keys"
    reason = _skip_reason(row)
    if reason is not None:
        pytest.skip(reason)
    run = smoke_runs[name].result()
    record_property("smoke_seconds", round(run.seconds, 1))
    done = run.done
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output on stdout\n{done.stderr[-3000:]}"
    if name == "gpu_check.py" and (gpu_reason := skip_reason()) is not None:
        assert lines == [f"gpu-check: skipped: {gpu_reason}"]  # documented: one line, exit 0, without a GPU
        return
    last = json.loads(lines[-1])
    assert isinstance(last, dict), lines[-1]
    expected = row.keys | (PODMAN_KEYS if name == "verify.py" and podman_problem() is None else frozenset())
    missing = sorted(expected - last.keys())
    assert not missing, f"last line lacks {missing}: {lines[-1][:2000]}"
    for key, value in row.holds:
        assert last[key] == value, f"{key}: {last[key]!r}, not {value!r}\n{done.stderr[-5000:]}"
