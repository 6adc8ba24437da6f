"""Gateway overhead, measured side by side in one run against the same fast engine server.

Part 1 — throughput and latency: harness -> gateway -> engine vs harness -> engine directly, at concurrency 1
and 64. The engine is the fast engine server (`tests/support/fast_engine.py`: real HTTP, a trivial
scripted model) in its own process, with a per-token delay standing in for decode time (`--per-token-ms`).
The gateway runs as its own process (`harnessrl gateway serve`), journaling with fsync as in production. The
direct harness speaks tokens itself (it appends sampled ids and the rendering of the next message), so both
arms send the same prompts to the same engine. Each harness runs multi-turn conversations of `--turns` calls.
Added latency = gateway latency percentile - direct latency percentile. At concurrency 64 the harnesses start
at random offsets within `--stagger-s` (the same offsets in both arms), as rollouts do; a lockstep run (all 64
fire at once, so the single-threaded gateway sees bursts of 64 calls) is measured and reported as well.

Part 2 — per-call gateway CPU at 1k / 32k / 128k-token histories (in process, the real tokenizer): a session
is seeded with a history of that size, then extended call by call; each call record carries the CPU time of
its prompt building + record (`gateway_cpu_s`) and of its JSON decoding + message conversion
(`parse_cpu_s`). Baseline: the CPU time of a full re-render + re-tokenization of the same conversation.

Last line: one JSON object with throughput_ratio_c64 and p99_added_ms_c64 (lockstep: 64 calls at once),
their `_staggered` counterparts, cpu_ratio_128k_vs_1k (and more).
Run: .venv/bin/python benchmarks/gateway.py [--smoke]

`--smoke` (also `--quick`): every part at its smallest, in seconds (2 calls at c=1, one call per harness at
c=64, 2 ms per token, one extend call at the 1k and the 128k history, so the JSON has the full run's keys;
the plot goes to a temporary folder unless `--plot` is given); the figures mean nothing.

`--large-body MB [MB ...]` measures only this: a `harnessrl gateway serve` process gets one authenticated
chat request of that many MB (one long user message) while `/health` is polled every 20 ms; reported per
size: the reply status, the longest `/health` wait (how long the event loop was blocked) and the gateway's
peak RSS.

Over 400 lines: three measurements that share the spawned gateway and engine processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

ADMIN = "bench-admin"
REPLIES = [
    {
        "text": 'I will look at the failing test first.\n<tool_call>\n{"name": "bash", "arguments": '
        '{"command": "pytest -x tests/test_utils.py"}}\n</tool_call>'
    },
    {"text": "The bug is in parse_date: it ignores the timezone. Let me fix it."},
    {
        "text": '<tool_call>\n{"name": "edit", "arguments": {"path": "utils.py", "old": "tz=None", '
        '"new": "tz=timezone.utc"}}\n</tool_call>'
    },
    {"text": "All tests pass now. The fix makes parse_date keep the timezone of its input."},
]
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("bash", "edit")
]


def _spawn(cmd: list[str], ready_word: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if ready_word not in line:
        proc.kill()
        raise SystemExit(f"failed to start {cmd[:4]}: {line!r}\n{proc.stderr.read()[-3000:]}")
    return proc, line.split()[-1]


def _spawn_gateway(engine_url: str, journal: Path) -> tuple[subprocess.Popen, str]:
    """`harnessrl gateway serve` in its own process, journaling to `journal`; returns (process, base URL)."""
    cmd = [sys.executable, "-m", "harnessrl.cli", "gateway", "serve", "--engine-url", engine_url]
    return _spawn([*cmd, "--journal", str(journal), "--admin-token", ADMIN], "READY")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Harness:
    """One worker: multi-turn conversations, either through the gateway (chat API) or straight to the engine
    (token API, the harness doing the token bookkeeping itself)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        renderer,
        mode: str,
        target: dict,
        turns: int,
        wid: int,
        unique_tool_output: bool = False,
    ):
        self.http, self.r, self.mode, self.target, self.turns, self.wid = (
            http,
            renderer,
            mode,
            target,
            turns,
            wid,
        )
        self.unique_tool_output = unique_tool_output
        self.latencies: list[float] = []

    def _first_messages(self, n: int) -> list[dict]:
        return [
            {"role": "system", "content": "You are a coding agent. Fix the bug; use the tools."},
            {
                "role": "user",
                "content": f"Worker {self.wid}, conversation {n}: tests in tests/test_utils.py "
                "fail with a timezone error. Find and fix the bug.",
            },
        ]

    async def run(self, calls: int, start_delay_s: float = 0.0) -> None:
        from harnessrl.gateway.messages import Msg, from_openai

        await asyncio.sleep(start_delay_s)
        n = 0
        while n < calls:
            msgs = self._first_messages(n)
            tokens = self.r.full_prompt(from_openai(msgs), TOOLS) if self.mode == "direct" else None
            for turn in range(self.turns):
                if n >= calls:
                    break
                t0 = time.perf_counter()
                if self.mode == "gateway":
                    async with self.http.post(
                        self.target["url"] + "/chat/completions",
                        json={"model": "p", "messages": msgs, "tools": TOOLS, "max_tokens": 128},
                        headers={"Authorization": f"Bearer {self.target['key']}"},
                    ) as resp:
                        body = await resp.json()
                        if resp.status != 200:
                            raise RuntimeError(f"gateway: HTTP {resp.status}: {body}")
                    msgs.append(body["choices"][0]["message"])
                else:
                    async with self.http.post(
                        self.target["url"] + "/v1/completions",
                        json={
                            "model": "fast",
                            "prompt": tokens,
                            "max_tokens": 128,
                            "logprobs": 0,
                            "return_token_ids": True,
                            "stop_token_ids": self.r.stop_token_ids,
                        },
                    ) as resp:
                        body = await resp.json()
                    ids = body["choices"][0]["token_ids"]
                    tokens = tokens + ids + self.r.close_assistant(ids)
                self.latencies.append(time.perf_counter() - t0)
                n += 1
                tool_msg = {"role": "tool", "content": f"output of step {turn}: 3 passed, 1 failed"}
                if (
                    self.unique_tool_output
                ):  # as real tool output is: no memo in the gateway's tokenizer helps
                    tool_msg["content"] = f"worker {self.wid}, conversation {n}: " + tool_msg["content"]
                if self.mode == "gateway":
                    msgs.append(tool_msg)
                else:
                    tokens = (
                        tokens
                        + self.r.message_delta(Msg("tool", tool_msg["content"]))
                        + self.r.generation_prompt_ids
                    )


async def load(
    renderer,
    mode: str,
    concurrency: int,
    calls: int,
    turns: int,
    engine_url: str,
    gateway_url: str,
    admin,
    stagger_s: float = 0.0,
    unique_tool_output: bool = False,
) -> dict:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as http:
        workers = []
        for w in range(concurrency):
            if mode == "gateway":
                s = await asyncio.to_thread(admin.create_session, f"bench-{mode}-{concurrency}-{w}", "bench")
                target = {"url": s.openai_base_url, "key": s.api_key}
            else:
                target = {"url": engine_url}
            workers.append(Harness(http, renderer, mode, target, turns, w, unique_tool_output))
        per = calls // concurrency
        rng = random.Random(concurrency)  # the same start offsets in both arms
        t0 = time.perf_counter()
        await asyncio.gather(*(w.run(per, rng.uniform(0, stagger_s)) for w in workers))
        wall = time.perf_counter() - t0
    lat = [x for w in workers for x in w.latencies]
    return {
        "calls": len(lat),
        "wall_s": wall,
        "throughput": len(lat) / wall,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
    }


def part_throughput(args, renderer, tmp: Path) -> dict:
    from harnessrl.gateway import GatewayAdmin

    script = tmp / "replies.json"
    script.write_text(json.dumps(REPLIES))
    eng, engine_url = _spawn(
        [
            sys.executable,
            "-m",
            "tests.support.fast_engine",
            "--script",
            str(script),
            "--select",
            "hash",
            "--per-token-ms",
            str(args.per_token_ms),
        ],
        "READY",
    )
    gw, gateway_url = _spawn_gateway(engine_url, tmp / "journal")
    admin = GatewayAdmin(gateway_url, ADMIN)
    results: dict[str, list[dict]] = {}
    try:
        setups = [(1, args.calls_c1, 0.0, ""), (64, args.calls_c64, args.stagger_s, "")]
        if args.stagger_s:
            setups.append((64, args.calls_c64, 0.0, "_lockstep"))
        for conc, calls, stagger, tag in setups:
            for rep in range(args.repeats):
                for mode in ("direct", "gateway") if rep % 2 == 0 else ("gateway", "direct"):
                    cpu0 = _proc_cpu_s(gw.pid)
                    r = asyncio.run(
                        load(
                            renderer,
                            mode,
                            conc,
                            calls,
                            args.turns,
                            engine_url,
                            gateway_url,
                            admin,
                            stagger,
                            args.unique_tool_output,
                        )
                    )
                    r["gateway_proc_cpu_ms_per_call"] = (_proc_cpu_s(gw.pid) - cpu0) / r["calls"] * 1e3
                    key = f"{mode}_c{conc}{tag}"
                    results.setdefault(key, []).append(r)
                    print(
                        f"  {key:>21} rep {rep}: {r['throughput']:7.1f} calls/s  p50 {r['p50_ms']:7.1f} ms  "
                        f"p99 {r['p99_ms']:7.1f} ms  gateway process CPU "
                        f"{r['gateway_proc_cpu_ms_per_call']:.2f} ms/call",
                        flush=True,
                    )
        metrics = admin.metrics()
    finally:
        for p in (gw, eng):
            p.terminate()
            p.wait(30)
    merged = {
        k: {
            m: statistics.mean(r[m] for r in v)
            for m in ("throughput", "p50_ms", "p99_ms", "gateway_proc_cpu_ms_per_call")
        }
        for k, v in results.items()
    }
    merged["journal"] = {"fsyncs": metrics["journal_fsyncs"], "records": metrics["journal_records"]}
    return merged


def part_cpu(args, tokenizer, tmp: Path) -> dict:
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
    from harnessrl.gateway.enums import ChainOp
    from harnessrl.gateway.journal import read_journal
    from harnessrl.gateway.messages import from_openai
    from harnessrl.gateway.records import CallRecord
    from harnessrl.gateway.render import ChatRenderer
    from tests.support.fast_engine import FastEngineServer

    fe = FastEngineServer(
        tokenizer, [{"text": "Done; the next step is to run the tests again."}], select="hash"
    )
    fe.start()
    cfg = GatewayConfig(max_model_len=1 << 20, drift_check_every=0)
    g = GatewayServer(HTTPEngine(fe.base_url), tokenizer, tmp / "journal-cpu", ADMIN, config=cfg)
    url = g.start()
    admin = GatewayAdmin(url, ADMIN)
    renderer = ChatRenderer(tokenizer, segment_memo=False)  # baseline: a plain re-render + re-tokenization
    rng = random.Random(0)
    words = (
        "def return self value test assert import having the of for in if not None error fix file line "
        "parse date timezone utc"
    ).split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    def post(s, msgs) -> dict:
        req = urllib.request.Request(
            s.openai_base_url + "/chat/completions",
            method="POST",
            data=json.dumps({"model": "p", "messages": msgs, "max_tokens": 32}).encode(),
            headers={"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())

    out = {}
    try:
        for size in args.sizes:
            s = admin.create_session(f"cpu-{size}", "bench")
            msgs = [{"role": "system", "content": "You are a coding agent."}]
            approx = 0
            while approx < size - 600:  # ~5 template tokens per message around its content
                for role in ("user", "assistant"):
                    msgs.append({"role": role, "content": text(min(250, size // 4))})
                    approx += len(tokenizer.encode(msgs[-1]["content"])) + 5
            msgs.append({"role": "user", "content": text(100)})
            reply = post(s, msgs)  # seeds the chain (one full render: a new chain)
            for _ in range(args.cpu_calls):
                msgs += [reply["choices"][0]["message"], {"role": "user", "content": text(100)}]
                reply = post(s, msgs)
            msg_objs = from_openai(msgs)
            rerender = []
            full: list[int] = []
            for _ in range(3):
                t0 = time.thread_time()
                full = renderer.full_prompt(msg_objs, [])
                rerender.append(time.thread_time() - t0)
            calls = [
                r
                for r in read_journal(tmp / "journal-cpu")
                if isinstance(r, CallRecord) and r.rollout_id == f"cpu-{size}" and r.op is ChainOp.EXTEND
            ]
            out[size] = {
                "history_tokens": len(full),
                "messages": len(msgs),
                "extend_calls": len(calls),
                "core_ms": statistics.median(c.timings.gateway_cpu_s for c in calls) * 1e3,
                "parse_ms": statistics.median(c.timings.parse_cpu_s for c in calls) * 1e3,
                "rerender_ms": statistics.median(rerender) * 1e3,
            }
            print(
                f"  history {len(full):>7} tokens, {len(msgs):>4} messages: core {out[size]['core_ms']:.2f} ms, "
                f"json+convert {out[size]['parse_ms']:.2f} ms | full re-render baseline "
                f"{out[size]['rerender_ms']:.1f} ms",
                flush=True,
            )
    finally:
        g.stop()
        fe.stop()
    return out


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _poll_health(url: str, waits: list[float], done: threading.Event) -> None:
    while not done.is_set():
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/health", timeout=600) as r:
            r.read()
        waits.append(time.perf_counter() - t0)
        time.sleep(0.02)


def part_large_body(sizes_mb: list[float], tmp: Path) -> dict:
    """One large authenticated body per fresh gateway process; /health polled meanwhile."""
    from harnessrl.gateway import GatewayAdmin

    script = tmp / "replies.json"
    script.write_text(json.dumps(REPLIES))
    eng, engine_url = _spawn(
        [sys.executable, "-m", "tests.support.fast_engine", "--script", str(script)], "READY"
    )
    out: dict[str, dict] = {}
    try:
        for mb in sizes_mb:
            gw, url = _spawn_gateway(engine_url, tmp / f"journal-body-{mb}")
            try:
                s = GatewayAdmin(url, ADMIN).create_session(f"body-{mb}", "bench")
                text = ("fix the bug in parse_date " * int(mb * 2**20 / 26 + 1))[: int(mb * 2**20)]
                body = json.dumps({"model": "p", "messages": [{"role": "user", "content": text}]}).encode()
                waits: list[float] = []
                done = threading.Event()
                poller = threading.Thread(target=_poll_health, args=(url, waits, done))
                poller.start()
                time.sleep(0.2)
                req = urllib.request.Request(
                    s.openai_base_url + "/chat/completions",
                    data=body,
                    method="POST",
                    headers={"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"},
                )
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(req, timeout=600) as r:
                        status = r.status
                except urllib.error.HTTPError as e:
                    status = e.code
                except OSError as e:  # the gateway may close the connection on a refused body
                    status = f"connection error: {e}"
                reply_s = time.perf_counter() - t0
                time.sleep(0.3)
                done.set()
                poller.join(600)
                out[f"{mb:g}MB"] = {
                    "status": status,
                    "reply_s": round(reply_s, 2),
                    "max_health_wait_s": round(max(waits), 3),
                    "peak_rss_mb": round(_peak_rss_mb(gw.pid)),
                }
                print(f"  {mb:g} MB body: {out[f'{mb:g}MB']}", flush=True)
            finally:
                gw.terminate()
                gw.wait(30)
    finally:
        eng.terminate()
        eng.wait(30)
    return out


def plot(tp: dict, cpu: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    keys = ["direct_c1", "gateway_c1", "direct_c64", "gateway_c64"]
    a.bar(keys, [tp[k]["throughput"] for k in keys], color=["grey", "tab:blue"] * 2)
    a.set_ylabel("calls / s")
    a.set_title("throughput (same fast engine)")
    sizes = sorted(cpu)
    x = [cpu[s]["history_tokens"] for s in sizes]
    b.plot(x, [cpu[s]["core_ms"] for s in sizes], "o-", label="gateway: prompt build + record")
    b.plot(x, [cpu[s]["core_ms"] + cpu[s]["parse_ms"] for s in sizes], "s-", label="+ JSON decode/convert")
    b.plot(x, [cpu[s]["rerender_ms"] for s in sizes], "x--", label="baseline: full re-render")
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("history tokens")
    b.set_ylabel("CPU ms per call")
    b.legend(fontsize=8)
    b.set_title("per-call CPU vs history")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--per-token-ms", type=float, default=20.0, help="fast engine decode time per token")
    p.add_argument("--calls-c1", type=int, default=40)
    p.add_argument("--calls-c64", type=int, default=1280)
    p.add_argument("--turns", type=int, default=4, help="calls per conversation")
    p.add_argument(
        "--stagger-s",
        type=float,
        default=1.0,
        help="c64: each harness starts after a random delay in [0, s) (same in both arms); a lockstep "
        "run (all 64 at once) is measured and reported too",
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="A/B repetitions per concurrency (order alternates)"
    )
    p.add_argument("--cpu-calls", type=int, default=6)
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 32768, 131072])
    p.add_argument("--plot", help="where the plot goes (default: benchmarks/results/gateway.png)")
    p.add_argument(
        "--unique-tool-output",
        action="store_true",
        help="tool results differ in every call (as in real rollouts; the fast engine then picks other "
        "replies, so compare only with runs that use the flag too)",
    )
    p.add_argument(
        "--smoke",
        "--quick",
        action="store_true",
        help="every part at its smallest (seconds; the figures mean nothing)",
    )
    p.add_argument(
        "--large-body", type=float, nargs="+", metavar="MB", help="measure only: event-loop stall and RSS"
    )
    args = p.parse_args()
    if args.large_body:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(part_large_body(args.large_body, Path(d))))
        return 0
    if args.smoke:
        args.calls_c1, args.calls_c64, args.repeats, args.cpu_calls = 2, 64, 1, 1
        args.per_token_ms = 2.0
        args.sizes = [min(args.sizes), max(args.sizes)]  # the headline's two sizes: the same keys
    from harnessrl.gateway.render import ChatRenderer
    from harnessrl.light_tokenizer import load_gateway_tokenizer

    tokenizer = load_gateway_tokenizer()
    renderer = ChatRenderer(tokenizer)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(f"throughput / latency (fast engine: {args.per_token_ms} ms per token)", flush=True)
        tp = part_throughput(args, renderer, tmp)
        print("per-call CPU vs history length", flush=True)
        cpu = part_cpu(args, tokenizer, tmp)
        if args.plot is None:
            args.plot = str(tmp / "gateway.png") if args.smoke else "benchmarks/results/gateway.png"
        plot(tp, cpu, Path(args.plot))
    lo, hi = min(cpu), max(cpu)
    # headline: 64 calls arriving at once (the single event loop's worst case); staggered starts alongside
    lock = (
        "_lockstep" if "gateway_c64_lockstep" in tp else ""
    )  # --stagger-s 0: the c64 run is the lockstep one

    def ratio(tag: str) -> float:
        return round(tp[f"gateway_c64{tag}"]["throughput"] / tp[f"direct_c64{tag}"]["throughput"], 3)

    def added(tag: str, pct: str) -> float:
        return round(tp[f"gateway_c64{tag}"][pct] - tp[f"direct_c64{tag}"][pct], 2)

    result = {
        "throughput_ratio_c64": ratio(lock),
        "p99_added_ms_c64": added(lock, "p99_ms"),
        "p50_added_ms_c64": added(lock, "p50_ms"),
        "throughput_ratio_c64_lockstep": ratio(lock),
        "throughput_ratio_c64_staggered": ratio(""),
        "p99_added_ms_c64_staggered": added("", "p99_ms"),
        "p50_added_ms_c64_staggered": added("", "p50_ms"),
        "throughput_ratio_c1": round(tp["gateway_c1"]["throughput"] / tp["direct_c1"]["throughput"], 3),
        "p50_added_ms_c1": round(tp["gateway_c1"]["p50_ms"] - tp["direct_c1"]["p50_ms"], 2),
        "p99_added_ms_c1": round(tp["gateway_c1"]["p99_ms"] - tp["direct_c1"]["p99_ms"], 2),
        "direct_c64_calls_per_s": round(tp[f"direct_c64{lock}"]["throughput"], 1),
        "gateway_c64_calls_per_s": round(tp[f"gateway_c64{lock}"]["throughput"], 1),
        "gateway_process_cpu_ms_per_call_c64": round(
            tp[f"gateway_c64{lock}"]["gateway_proc_cpu_ms_per_call"], 2
        ),
        "gateway_process_cpu_ms_per_call_c64_staggered": round(
            tp["gateway_c64"]["gateway_proc_cpu_ms_per_call"], 2
        ),
        "journal_records_per_fsync": round(tp["journal"]["records"] / max(tp["journal"]["fsyncs"], 1), 2),
        f"cpu_ratio_{hi // 1024}k_vs_{lo // 1024}k": round(cpu[hi]["core_ms"] / cpu[lo]["core_ms"], 3),
        f"cpu_ratio_incl_json_{hi // 1024}k_vs_{lo // 1024}k": round(
            (cpu[hi]["core_ms"] + cpu[hi]["parse_ms"]) / (cpu[lo]["core_ms"] + cpu[lo]["parse_ms"]), 3
        ),
        f"rerender_cpu_ratio_{hi // 1024}k_vs_{lo // 1024}k": round(
            cpu[hi]["rerender_ms"] / cpu[lo]["rerender_ms"], 2
        ),
        "core_cpu_ms": {str(s): round(cpu[s]["core_ms"], 3) for s in sorted(cpu)},
        "rerender_cpu_ms": {str(s): round(cpu[s]["rerender_ms"], 2) for s in sorted(cpu)},
        "per_token_ms": args.per_token_ms,
        "unique_tool_output": args.unique_tool_output,
        "plot": args.plot,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
