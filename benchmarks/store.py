"""harnessrl.store on a real S3 endpoint (moto's server on loopback): what resuming a download saves and
what the part size does to multipart uploads. Baselines are measured in the same run.

    .venv/bin/python benchmarks/store.py [--mb 96] [--smoke]

`--smoke`: an 11 MiB object (still three 5 MiB parts at the smallest part size), seconds.

Last line: JSON with resume_bytes_ratio (bytes fetched by a resumed download / by a restart from zero),
resume_time_ratio, and upload seconds per part size relative to the 5 MiB minimum.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from moto.server import ThreadedMotoServer

from harnessrl.store import MIN_PART_SIZE, ObjectStore, StoreConfig


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=int, default=96, help="object size in MiB")
    parser.add_argument("--interrupt-at", type=float, default=0.75, help="fraction downloaded before the cut")
    parser.add_argument("--smoke", action="store_true", help="an 11 MiB object (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.mb = 11
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        store = ObjectStore(
            StoreConfig(
                endpoint=f"http://{host}:{port}", access_key="bench", secret_key="bench", region="us-east-1"
            )
        )
        store.ensure_bucket("bench")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            src = tmp / "ckpt.bin"
            src.write_bytes(os.urandom(args.mb * 2**20))
            size = src.stat().st_size
            uploads = {}
            for part_mb in (5, 16, 64):
                _, secs = timed(
                    lambda p=part_mb: store.upload_file(src, f"s3://bench/ckpt-{p}.bin", part_size=p * 2**20)
                )
                uploads[part_mb] = secs
                print(f"upload {args.mb} MiB, part {part_mb:>2} MiB: {secs:6.2f} s")
            uri = "s3://bench/ckpt-16.bin"
            etag = store.stat(uri)[2]
            cut = int(size * args.interrupt_at)

            def interrupted(dest: Path) -> None:  # what a killed download leaves behind
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(src, "rb") as f:
                    dest.with_name(dest.name + ".part").write_bytes(f.read(cut))
                dest.with_name(dest.name + ".part.etag").write_text(etag)

            interrupted(tmp / "a" / "ckpt.bin")
            resumed, t_resume = timed(lambda: store.download_file(uri, tmp / "a" / "ckpt.bin"))
            interrupted(tmp / "b" / "ckpt.bin")
            restarted, t_restart = timed(
                lambda: store.download_file(uri, tmp / "b" / "ckpt.bin", resume=False)
            )
            assert resumed.sha256 == restarted.sha256
            print(
                f"after a cut at {args.interrupt_at:.0%}: resume fetched {resumed.bytes_transferred / 2**20:.1f} MiB "
                f"in {t_resume:.2f} s; restart fetched {restarted.bytes_transferred / 2**20:.1f} MiB "
                f"in {t_restart:.2f} s (both verified by sha256)"
            )
            result = {
                "object_mib": args.mb,
                "resume_bytes_ratio": round(resumed.bytes_transferred / restarted.bytes_transferred, 3),
                "resume_time_ratio": round(t_resume / t_restart, 3),
                "resume_seconds": round(t_resume, 3),
                "restart_seconds": round(t_restart, 3),
                "upload_seconds_by_part_mib": {str(k): round(v, 3) for k, v in uploads.items()},
                "upload_time_ratio_vs_5mib": {str(k): round(v / uploads[5], 3) for k, v in uploads.items()},
                "min_part_mib": MIN_PART_SIZE // 2**20,
            }
    finally:
        server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
