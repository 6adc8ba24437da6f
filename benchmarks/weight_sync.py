"""Seconds per weight sync into a real `harnessrl engine serve` process: by checkpoint path vs by broadcast
(gloo), the loop's two publishers (harnessrl.rl.publish), alternating in the same run on the same engine; then
a LoRA run's syncs (`--lora-rank`, 0: none): the adapter alone by either publisher, merged by the engine.

    .venv/bin/python benchmarks/weight_sync.py [--model DIR] [--repeats 3] [--lora-rank 8] [--smoke]

Default model: the embedded tiny model (SmolLM2-135M, fp32). Prints one line per sync and, last, one JSON line
(`checkpoint_s`, `broadcast_s`: medians of full syncs; `broadcast_vs_checkpoint`: their ratio; `join_s`: forming
the broadcast group, once per run; `adapter_checkpoint_s`, `adapter_broadcast_s`: medians of adapter syncs,
after one unmeasured adapter sync (where the engine keeps its copy of the base); `adapter_bytes` and
`adapter_vs_full_broadcast`; the load average before and after). `--smoke`: one sync per publisher.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="Hugging Face model directory (default: the embedded tiny model)")
    parser.add_argument("--repeats", type=int, default=3, help="syncs per publisher")
    parser.add_argument("--lora-rank", type=int, default=8, help="adapter syncs of this rank too (0: none)")
    parser.add_argument("--smoke", action="store_true", help="one sync per publisher (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1

    from harnessrl.engine.base import SamplingParams
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.rl.publish import BroadcastPublisher, CheckpointPublisher
    from harnessrl.tinymodel import load_model, tiny_model_dir
    from harnessrl.train.lora import LoraSettings, adapter_of, add_adapters
    from tests.support.weight_sync import serve_process

    model_dir = Path(args.model) if args.model else tiny_model_dir()
    load_before = os.getloadavg()
    proc, url = serve_process(model_dir)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    client = HTTPEngine(url)
    model = load_model(model_dir).eval()
    adapter = None
    if args.lora_rank:
        settings = LoraSettings(rank=args.lora_rank)
        adapted = load_model(model_dir).eval()
        add_adapters(adapted, settings)
        adapter = adapter_of(adapted.state_dict().items(), settings)
        del adapted
    times: dict[str, list[float]] = {"checkpoint": [], "broadcast": []}
    adapter_times: dict[str, list[float]] = {"checkpoint": [], "broadcast": []}
    with tempfile.TemporaryDirectory(prefix="weight-sync-bench-") as tmp:
        broadcast = BroadcastPublisher(client, loop, name="bench")
        publishers = {
            "checkpoint": CheckpointPublisher(client, model, Path(tmp), "bench", loop),
            "broadcast": broadcast,
        }
        try:
            version = 0
            for _ in range(args.repeats):
                for kind, publisher in publishers.items():
                    version += 1
                    seconds = publisher.publish(version, model.named_parameters())
                    if kind == "broadcast" and version == 2:
                        seconds -= broadcast.join_s  # forming the group: reported apart
                    times[kind].append(seconds)
                    print(f"weight-sync {kind} v{version}: {seconds:.3f} s", flush=True)
            if adapter is not None:
                version += 1
                publishers["checkpoint"].publish_adapter(version, adapter)  # the engine copies its base here
                for _ in range(args.repeats):
                    for kind, publisher in publishers.items():
                        version += 1
                        adapter_times[kind].append(seconds := publisher.publish_adapter(version, adapter))
                        print(f"weight-sync {kind} adapter v{version}: {seconds:.3f} s", flush=True)
            reply = asyncio.run_coroutine_threadsafe(
                client.generate([1, 2, 3], SamplingParams(temperature=0.0), 2), loop
            ).result()
            assert reply.token_policy_versions == [version] * 2
        finally:
            for publisher in publishers.values():
                publisher.close()
            asyncio.run_coroutine_threadsafe(client.release(), loop).result()
            proc.kill()
            proc.wait()
    checkpoint_s = statistics.median(times["checkpoint"])
    broadcast_s = statistics.median(times["broadcast"])
    params = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {
                "model": str(model_dir),
                "parameters": params,
                "bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                "checkpoint_s": round(checkpoint_s, 3),
                "broadcast_s": round(broadcast_s, 3),
                "broadcast_vs_checkpoint": round(broadcast_s / checkpoint_s, 3),
                "join_s": round(broadcast.join_s, 3),
                **(
                    {
                        "lora_rank": args.lora_rank,
                        "adapter_bytes": adapter.nbytes,
                        "adapter_checkpoint_s": round(statistics.median(adapter_times["checkpoint"]), 3),
                        "adapter_broadcast_s": round(statistics.median(adapter_times["broadcast"]), 3),
                        "adapter_vs_full_broadcast": round(
                            statistics.median(adapter_times["broadcast"]) / broadcast_s, 3
                        ),
                    }
                    if adapter is not None
                    else {}
                ),
                "all": {k: [round(t, 3) for t in v] for k, v in times.items()},
                "all_adapter": {k: [round(t, 3) for t in v] for k, v in adapter_times.items()},
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
