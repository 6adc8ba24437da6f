"""Journal lines are written by orjson on the hot path: the stdlib's compact JSON (same bytes but for
the spelling of some floats, same values), and non-finite logprobs still survive a write + replay (orjson alone would turn them to null)."""

from __future__ import annotations

import asyncio
import json
import math

from harnessrl.gateway.journal import Journal, encode_record, loads, read_journal


def _record(lps: list[float]) -> dict:
    return {
        "type": "call",
        "call_id": "c-1",
        "session_id": "s-ü漢",
        "parent_chain_id": None,
        "drift": None,
        "base_len": 12,
        "delta_ids": list(range(50)),
        "inherited_nodes": [["ab" * 16, 3, "seed"]],
        "completion_ids": list(range(len(lps))),
        "completion_logprobs": lps,
        "api": "openai",
        "timings": {"started_at": 1764489600.123456, "engine_s": 0.0123, "gateway_cpu_s": 1e-05},
    }


def test_orjson_line_equals_the_stdlib_line():
    rec = _record([-0.05, -0.16, -1.0000000000000002, -2.5e-07, 0.0])
    line = encode_record(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == rec  # every float round-trips exactly (orjson may spell 1e-05 as 0.00001)
    assert loads(line) == rec
    no_floats = {k: v for k, v in rec.items() if k not in ("completion_logprobs", "timings")}
    assert (
        encode_record(no_floats)
        == (json.dumps(no_floats, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    )


def test_non_finite_logprobs_survive_the_journal(tmp_path):
    recs = [_record([-0.1, -math.inf, -0.2]), _record([-0.3, math.nan]), _record([-0.4])]

    async def write() -> None:
        j = Journal(tmp_path)
        try:
            await asyncio.gather(*(j.append(r) for r in recs))
        finally:
            j.close()

    asyncio.run(write())
    back = list(read_journal(tmp_path))
    assert [r["completion_logprobs"][:1] for r in back] == [[-0.1], [-0.3], [-0.4]]
    inf_rec = next(r for r in back if len(r["completion_logprobs"]) == 3)
    assert inf_rec["completion_logprobs"][1] == -math.inf
    nan_rec = next(r for r in back if r["completion_logprobs"][0] == -0.3)
    assert math.isnan(nan_rec["completion_logprobs"][1])
