"""Journal lines: typed records <-> the on-disk JSON of the first journal version (a journal written by that
version still loads, and re-encodes to the same bytes); orjson on the hot path writes the stdlib's compact
JSON (same values), and non-finite logprobs survive a write + replay (orjson alone would turn them to null)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

from harnessrl.engine.base import FinishReason
from harnessrl.gateway.enums import Api, ChainOp, NodeKind
from harnessrl.gateway.journal import Journal, decode_line, encode_record, loads, read_journal, record_to_json
from harnessrl.gateway.records import (
    CallRecord,
    CallTimings,
    Node,
    NoticeRecord,
    SessionEndRecord,
    SessionRecord,
)
from harnessrl.gateway.samples import build_samples, call_rows

V1_JOURNAL = Path(__file__).parent / "data" / "journal_v1.jsonl"


def _record(lps: list[float], call_id: str = "c-1") -> CallRecord:
    return CallRecord(
        call_id=call_id,
        session_id="s-ü漢",
        rollout_id="r",
        group_id="g",
        chain_id="ch-1",
        op=ChainOp.NEW,
        parent_chain_id=None,
        base_len=12,
        base_nodes=0,
        inherited_ids=list(range(12)),
        inherited_nodes=[Node(bytes.fromhex("ab" * 16), 3, NodeKind.SEED)],
        delta_ids=list(range(50)),
        new_nodes=[],
        completion_ids=list(range(len(lps))),
        completion_logprobs=lps,
        completion_versions=[0] * len(lps),
        close_ids=[198],
        assistant_cum=bytes(16),
        finish_reason=FinishReason.STOP,
        discarded_trainable=0,
        api=Api.OPENAI,
        timings=CallTimings(started_at=1764489600.123456, engine_s=0.0123, gateway_cpu_s=1e-05),
    )


def test_orjson_line_equals_the_stdlib_line_and_round_trips():
    rec = _record([-0.05, -0.16, -1.0000000000000002, -2.5e-07, 0.0])
    line = encode_record(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    d = record_to_json(rec)
    assert (
        json.loads(line) == d == loads(line)
    )  # every float round-trips exactly (orjson may spell 1e-05 as 0.00001)
    assert decode_line(line) == rec
    plain = _record([-0.5, -0.25])  # floats both libraries spell alike: the very same bytes
    plain.timings = CallTimings(started_at=1764489600.5, engine_s=0.125)
    stdlib = json.dumps(record_to_json(plain), ensure_ascii=False, separators=(",", ":")) + "\n"
    assert encode_record(plain) == stdlib.encode()


def test_a_journal_of_the_first_version_loads_and_re_encodes_to_the_same_bytes():
    lines = V1_JOURNAL.read_bytes().splitlines(keepends=True)
    records = list(read_journal(V1_JOURNAL))
    assert len(records) == len(lines) == 10
    assert [encode_record(r) for r in records] == lines
    kinds = [type(r).__name__ for r in records]
    assert kinds.count("CallRecord") == 5 and kinds.count("SessionRecord") == 2
    assert {r.op for r in records if isinstance(r, CallRecord)} == set(ChainOp)
    assert any(isinstance(r, NoticeRecord) for r in records)
    assert [r.status for r in records if isinstance(r, SessionEndRecord)] == ["ended", "failed"]
    assert all(r.key_sha256 for r in records if isinstance(r, SessionRecord))
    samples = build_samples(records)
    assert {s.rollout_status for s in samples if s.rollout_id == "r2"} == {"failed"}
    assert len(call_rows(records)) == 5


def test_non_finite_logprobs_survive_the_journal(tmp_path):
    recs = [_record([-0.1, -math.inf, -0.2], "c-1"), _record([-0.3, math.nan], "c-2"), _record([-0.4], "c-3")]

    async def write() -> None:
        j = Journal(tmp_path)
        try:
            await asyncio.gather(*(j.append(r) for r in recs))
        finally:
            j.close()

    asyncio.run(write())
    back = [r for r in read_journal(tmp_path) if isinstance(r, CallRecord)]
    assert [r.completion_logprobs[:1] for r in back] == [[-0.1], [-0.3], [-0.4]]
    inf_rec = next(r for r in back if len(r.completion_logprobs) == 3)
    assert inf_rec.completion_logprobs[1] == -math.inf
    nan_rec = next(r for r in back if r.completion_logprobs[0] == -0.3)
    assert math.isnan(nan_rec.completion_logprobs[1])
