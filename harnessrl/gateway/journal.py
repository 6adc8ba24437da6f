"""The journal: typed records <-> JSON lines (the one codec), reading, and the group-commit writer.

Append-only JSONL; `await append(rec)` returns once the record is fsynced. One writer thread takes every
record queued since its last fsync, writes them in one go and fsyncs once, so N concurrent calls cost one
fsync, not N. On open, a torn last line (a write cut by a crash; it was never acknowledged) is cut off;
everything before it is returned by `replay()`. One gateway per journal directory (an exclusive lock says so
clearly instead of interleaving two writers).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import math
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from .enums import Api, ChainOp, Drift, FinishReason, NodeKind, NoticeKind, SessionStatus
from .records import (
    CallRecord,
    CallTimings,
    Node,
    NoticeRecord,
    Record,
    SessionEndRecord,
    SessionRecord,
)

logger = logging.getLogger(__name__)

JOURNAL_NAME = "journal.jsonl"

_Item = tuple[bytes, "asyncio.Future[None]", asyncio.AbstractEventLoop]  # line, its waiter, the waiter's loop


class JournalLockedError(RuntimeError):
    pass


# -- codec ------------------------------------------------------------------------------------------------
def loads(data: bytes | str) -> Any:
    """orjson's parse (several times faster); the stdlib's for what orjson rejects (NaN / Infinity literals,
    written by `encode_record` for non-finite logprobs), so errors and accepted inputs stay the stdlib's."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _nodes_out(nodes: list[Node]) -> list[list[Any]]:
    return [[n.cum.hex(), n.token_len, n.kind.value] for n in nodes]


def _nodes_in(raw: list[list[Any]]) -> list[Node]:
    return [Node(bytes.fromhex(v[0]), int(v[1]), NodeKind(v[2])) for v in raw]


def record_to_json(rec: Record) -> dict[str, Any]:
    """The on-disk form (keys and value spellings of the first journal version)."""
    if isinstance(rec, CallRecord):
        t = rec.timings
        return {
            "type": rec.TYPE.value,
            "call_id": rec.call_id,
            "session_id": rec.session_id,
            "rollout_id": rec.rollout_id,
            "group_id": rec.group_id,
            "chain_id": rec.chain_id,
            "op": rec.op.value,
            "parent_chain_id": rec.parent_chain_id,
            "base_len": rec.base_len,
            "base_nodes": rec.base_nodes,
            "inherited_ids": rec.inherited_ids,
            "inherited_nodes": _nodes_out(rec.inherited_nodes),
            "delta_ids": rec.delta_ids,
            "new_nodes": _nodes_out(rec.new_nodes),
            "completion_ids": rec.completion_ids,
            "completion_logprobs": rec.completion_logprobs,
            "completion_versions": rec.completion_versions,
            "close_ids": rec.close_ids,
            "assistant_cum": rec.assistant_cum.hex(),
            "finish_reason": rec.finish_reason.value,
            "discarded_trainable": rec.discarded_trainable,
            "drift": None if rec.drift is None else rec.drift.value,
            "api": None if rec.api is None else rec.api.value,
            "timings": {
                "started_at": t.started_at,
                "engine_s": t.engine_s,
                "prompt_tokens": t.prompt_tokens,
                "drift_cpu_s": t.drift_cpu_s,
                "gateway_cpu_s": t.gateway_cpu_s,
                "parse_cpu_s": t.parse_cpu_s,
            },
        }
    if isinstance(rec, SessionRecord):
        return {
            "type": rec.TYPE.value,
            "session_id": rec.session_id,
            "rollout_id": rec.rollout_id,
            "group_id": rec.group_id,
            "key_sha256": rec.key_sha256,
            "created_at": rec.created_at,
        }
    if isinstance(rec, SessionEndRecord):
        return {
            "type": rec.TYPE.value,
            "session_id": rec.session_id,
            "status": rec.status.value,
            "reason": rec.reason,
            "at": rec.at,
        }
    return {
        "type": rec.TYPE.value,
        "session_id": rec.session_id,
        "kind": rec.kind.value,
        "prompt_tokens": rec.prompt_tokens,
        "at": rec.at,
    }


def record_from_json(d: Any) -> Record:
    """Raises ValueError saying what is wrong with a line's JSON value."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    kind = d.get("type")
    try:
        if kind == "call":
            t = d.get("timings") or {}
            return CallRecord(
                call_id=d["call_id"],
                session_id=d["session_id"],
                rollout_id=d["rollout_id"],
                group_id=d["group_id"],
                chain_id=d["chain_id"],
                op=ChainOp(d["op"]),
                parent_chain_id=d.get("parent_chain_id"),
                base_len=int(d["base_len"]),
                base_nodes=int(d["base_nodes"]),
                inherited_ids=d["inherited_ids"],
                inherited_nodes=_nodes_in(d["inherited_nodes"]),
                delta_ids=d["delta_ids"],
                new_nodes=_nodes_in(d["new_nodes"]),
                completion_ids=d["completion_ids"],
                completion_logprobs=d["completion_logprobs"],
                completion_versions=d["completion_versions"],
                close_ids=d["close_ids"],
                assistant_cum=bytes.fromhex(d["assistant_cum"]),
                finish_reason=FinishReason(d["finish_reason"]),
                discarded_trainable=int(d["discarded_trainable"]),
                drift=None if d.get("drift") is None else Drift(d["drift"]),
                api=None if d.get("api") is None else Api(d["api"]),
                timings=CallTimings(
                    started_at=t.get("started_at", 0.0),
                    engine_s=t.get("engine_s", 0.0),
                    prompt_tokens=t.get("prompt_tokens", 0),
                    drift_cpu_s=t.get("drift_cpu_s", 0.0),
                    gateway_cpu_s=t.get("gateway_cpu_s", 0.0),
                    parse_cpu_s=t.get("parse_cpu_s", 0.0),
                ),
            )
        if kind == "session":
            return SessionRecord(
                d["session_id"], d["rollout_id"], d["group_id"], d["key_sha256"], d.get("created_at", 0.0)
            )
        if kind == "session_end":
            return SessionEndRecord(
                d["session_id"], SessionStatus(d["status"]), d.get("reason"), d.get("at", 0.0)
            )
        if kind == "notice":
            return NoticeRecord(
                d["session_id"], NoticeKind(d["kind"]), int(d["prompt_tokens"]), d.get("at", 0.0)
            )
    except KeyError as e:
        raise ValueError(f"{kind} record without {e.args[0]!r}") from None
    except (TypeError, IndexError) as e:
        raise ValueError(f"malformed {kind} record ({e})") from None
    raise ValueError(f"unknown record type {kind!r}")


def encode_record(rec: Record) -> bytes:
    """One journal line: compact UTF-8 JSON (what `json.dumps(ensure_ascii=False, separators=(",", ":"))`
    writes), by orjson: serializing a record's token id lists is the largest part of journaling.
    orjson writes NaN / ±inf as null, so a record with a non-finite logprob (the only floats that do not come
    from our own clocks) goes through the stdlib, which keeps them readable as NaN / -Infinity."""
    d = record_to_json(rec)
    if (
        isinstance(rec, CallRecord)
        and rec.completion_logprobs
        and not math.isfinite(sum(rec.completion_logprobs))
    ):
        return (json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    return orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE)


def decode_line(line: bytes | str) -> Record:
    return record_from_json(loads(line))


# -- reading ----------------------------------------------------------------------------------------------
def journal_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / JOURNAL_NAME if p.is_dir() else p


def read_journal(path: str | os.PathLike) -> Iterator[Record]:
    """Yields the complete records of a journal file (a directory or the file itself); skips a torn tail."""
    p = journal_file(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no gateway journal here (is the journal directory right?)")
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # torn tail: never acknowledged
            try:
                yield decode_line(line)
            except ValueError as e:
                raise ValueError(
                    f"{p}:{lineno}: corrupt journal line ({e}); "
                    "only the last line may be torn — restore this file from a backup"
                ) from None


# -- writing ----------------------------------------------------------------------------------------------
class Journal:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / JOURNAL_NAME
        self._lock = open(self.dir / ".lock", "w")  # noqa: SIM115 - held for the journal's lifetime
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise JournalLockedError(
                f"{self.dir}: another gateway process is using this journal directory"
            ) from None
        self._cut_torn_tail()
        self._f = open(self.path, "ab")  # noqa: SIM115
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self.fsyncs = 0
        self.records_written = 0
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="gateway-journal", daemon=True)
        self._thread.start()

    def _cut_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end != len(data):
                logger.warning(
                    "%s: cutting a torn last line (%d bytes, never acknowledged)", self.path, len(data) - end
                )
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def replay(self) -> Iterator[Record]:
        return read_journal(self.path)

    async def append(self, rec: Record) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put((encode_record(rec), fut, loop))
        await fut

    def _writer(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = [item]
            while True:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                batch.append(nxt)
            err: BaseException | None = None
            try:
                self._f.write(b"".join(line for line, _, _ in batch))
                self._f.flush()
                os.fsync(self._f.fileno())
                self.fsyncs += 1
                self.records_written += len(batch)
            except OSError as e:
                err = e
            for _, fut, loop in batch:
                loop.call_soon_threadsafe(_resolve, fut, err)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout=10)
        self._f.close()
        self._lock.close()


def _resolve(fut: asyncio.Future[None], err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
