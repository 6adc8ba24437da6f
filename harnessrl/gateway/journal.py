"""The journal: typed records <-> JSON lines (the one codec), reading (strict or salvage), and the
group-commit writer. One module because the three share one file format and its failure modes.

Append-only JSONL; `await append(rec)` returns once the record is fsynced. One writer thread takes every
record queued since its last fsync, writes them in one go and fsyncs once, so N concurrent calls cost one
fsync, not N. A write that fails (disk full, I/O error) is cut back to the last complete line and its
records are not acknowledged (`JournalWriteError`); if even that fails the journal refuses every later
append. On open, a torn last line (a write cut by a crash; it was never acknowledged) is cut off. One gateway
per journal directory (an exclusive lock says so clearly instead of interleaving two writers).

Reading: a corrupt line before the end stops a strict read with its line number; a salvage read keeps every
complete record (also one glued behind a cut-off write) and reports what it dropped. A call id seen twice
(a duplicated line) is kept once and reported, in both modes.
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
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from harnessrl.engine.base import FinishReason

from .chains import STARTS_CHAIN
from .enums import Api, ChainOp, Drift, NodeKind, NoticeKind, SessionStatus, TrainChains
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


T = TypeVar("T")


class JournalLockedError(RuntimeError):
    pass


class JournalCorruptError(ValueError):
    """A line before the end of the journal is not a record (strict reading)."""


class JournalWriteError(RuntimeError):
    """A record could not be made durable (disk full, I/O error): its call is not acknowledged."""


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
        out = {
            "type": rec.TYPE.value,
            "session_id": rec.session_id,
            "rollout_id": rec.rollout_id,
            "group_id": rec.group_id,
            "key_sha256": rec.key_sha256,
            "created_at": rec.created_at,
        }
        if rec.train_chains is not TrainChains.ALL:  # written only when set: journals of before read the same
            out["train_chains"] = rec.train_chains.value
        if rec.reply_tokens is not None:
            out["reply_tokens"] = rec.reply_tokens
        if rec.context_tokens is not None:
            out["context_tokens"] = rec.context_tokens
        return out
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
                d["session_id"],
                d["rollout_id"],
                d["group_id"],
                d["key_sha256"],
                d.get("created_at", 0.0),
                TrainChains(d.get("train_chains", TrainChains.ALL)),
                d.get("reply_tokens"),
                d.get("context_tokens"),
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


@dataclass
class LineIssue:
    line: int
    what: str


@dataclass
class JournalReport:
    """What a read of a journal kept and left out (line numbers are 1-based)."""

    path: str = ""
    lines: int = 0
    records: int = 0
    torn_tail: bool = False  # the last line was cut by a crash (never acknowledged)
    dropped: list[LineIssue] = field(default_factory=list)  # salvage: lines that are not records
    recovered: list[LineIssue] = field(default_factory=list)  # salvage: records found behind a cut-off write
    duplicates: list[LineIssue] = field(default_factory=list)  # lines repeating a call id / session id

    @property
    def repaired(self) -> bool:
        """True when a strict reader would refuse this file."""
        return bool(self.dropped or self.recovered)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "lines": self.lines,
            "records": self.records,
            "torn_tail": self.torn_tail,
            "dropped": [[i.line, i.what] for i in self.dropped],
            "recovered": [[i.line, i.what] for i in self.recovered],
            "duplicates": [[i.line, i.what] for i in self.duplicates],
        }

    def summary(self) -> str:
        def lines(issues: list[LineIssue]) -> str:
            shown = ", ".join(str(i.line) for i in issues[:20])
            return shown + (f" (+{len(issues) - 20} more)" if len(issues) > 20 else "")

        parts = [f"{self.path}: {self.records} records kept of {self.lines} lines"]
        if self.dropped:
            parts.append(f"{len(self.dropped)} corrupt lines dropped (lines {lines(self.dropped)})")
        if self.recovered:
            parts.append(
                f"{len(self.recovered)} records recovered behind cut-off writes (lines {lines(self.recovered)})"
            )
        if self.duplicates:
            parts.append(f"{len(self.duplicates)} duplicate records skipped (lines {lines(self.duplicates)})")
        return "; ".join(parts)


_RECORD_START = b'{"type":"'


def _decode_salvaged(line: bytes) -> tuple[Record, int] | None:
    """A record glued behind the remains of a cut-off write: (record, bytes before it), or None."""
    at = line.find(_RECORD_START, 1)
    while at > 0:
        try:
            return decode_line(line[at:]), at
        except ValueError:
            at = line.find(_RECORD_START, at + 1)
    return None


def read_journal(
    path: str | os.PathLike, salvage: bool = False, report: JournalReport | None = None
) -> Iterator[Record]:
    """Yields the complete records of a journal file (a directory or the file itself); skips a torn tail.

    A corrupt line raises JournalCorruptError naming it, or with `salvage` is left out; so is a call that
    continues a chain whose first call is missing. A repeated call id or session id is kept once. What was
    left out goes into `report`."""
    p = journal_file(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no gateway journal here (is the journal directory right?)")
    report = report if report is not None else JournalReport()
    report.path = str(p)
    calls: set[str] = set()
    sessions: set[str] = set()
    chains: set[str] = set()

    def corrupt(lineno: int, what: str) -> None:
        if not salvage:
            raise JournalCorruptError(
                f"{p}:{lineno}: corrupt journal line ({what}); only the last line may be torn. "
                "Rerun with --salvage (`harnessrl gateway export` or `serve`) to keep every complete record "
                "and report what is dropped"
            )
        report.dropped.append(LineIssue(lineno, what))

    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            report.lines += 1
            if not line.endswith(b"\n"):
                report.torn_tail = True
                return  # never acknowledged
            try:
                rec = decode_line(line)
            except ValueError as e:
                found = _decode_salvaged(line) if salvage else None
                if found is None:
                    corrupt(lineno, str(e))
                    continue
                rec, cut = found
                report.recovered.append(
                    LineIssue(lineno, f"{cut} bytes of a cut-off write dropped before it")
                )
            if isinstance(rec, CallRecord):
                if rec.call_id in calls:
                    report.duplicates.append(LineIssue(lineno, f"call {rec.call_id}"))
                    continue
                if rec.op not in STARTS_CHAIN and rec.chain_id not in chains:
                    corrupt(
                        lineno,
                        f"call {rec.call_id} continues chain {rec.chain_id}, whose first call is missing",
                    )
                    continue
                calls.add(rec.call_id)
                chains.add(rec.chain_id)
            elif isinstance(rec, SessionRecord):
                if rec.session_id in sessions:
                    report.duplicates.append(LineIssue(lineno, f"session {rec.session_id}"))
                    continue
                sessions.add(rec.session_id)
            report.records += 1
            yield rec


# -- writing ----------------------------------------------------------------------------------------------
async def shielded(step: Coroutine[Any, Any, T]) -> T:
    """Runs `step` (a journal append and the live state change it records) to its end even when the caller
    is cancelled — a client that disconnects mid-fsync must not leave a journaled record unapplied."""
    task = asyncio.ensure_future(step)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:  # the caller may be gone: seen here, not at GC
        logger.debug("journaled step failed after its caller left: %s", task.exception())


class Journal:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / JOURNAL_NAME
        self._lock = open(self.dir / ".lock", "w")  # held for the journal's lifetime
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise JournalLockedError(
                f"{self.dir}: another gateway process is using this journal directory"
            ) from None
        self._cut_torn_tail()
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size  # bytes of complete, durable records
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self.fsyncs = 0
        self.records_written = 0
        self.write_failures = 0
        self.broken: JournalWriteError | None = None  # set when a failed write could not be cut back
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="gateway-journal", daemon=True)
        self._thread.start()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

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

    def replay(self, salvage: bool = False, report: JournalReport | None = None) -> Iterator[Record]:
        return read_journal(self.path, salvage, report)

    def replace_with_salvaged(self) -> Path:
        """Rewrites the journal as its salvaged records (before the first append); the original is kept
        beside it as `journal.jsonl.corrupt-<time>`. Returns that backup's path."""
        backup = self.path.with_name(f"{JOURNAL_NAME}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        tmp = self.path.with_name(f".{JOURNAL_NAME}.salvaged")
        with open(tmp, "wb") as f:
            for rec in read_journal(self.path, salvage=True):
                f.write(encode_record(rec))
            f.flush()
            os.fsync(f.fileno())
        os.close(self._fd)
        os.replace(self.path, backup)  # the original, as it was
        os.replace(tmp, self.path)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size
        return backup

    async def append(self, rec: Record) -> None:
        """Returns once `rec` is durable; raises JournalWriteError if it could not be written."""
        if self.broken is not None:
            raise self.broken
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
            err = self._write(b"".join(line for line, _, _ in batch))
            if err is None:
                self.records_written += len(batch)
            for _, fut, loop in batch:
                loop.call_soon_threadsafe(_resolve, fut, err)

    def _write(self, data: bytes) -> JournalWriteError | None:
        if self.broken is not None:
            return self.broken
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as e:
            self.write_failures += 1
            return self._cut_back(e)
        self._size += len(data)
        self.fsyncs += 1
        return None

    def _cut_back(self, cause: OSError) -> JournalWriteError:
        """After a failed write: the file ends at the last complete record again, or the journal is broken."""
        what = cause.strerror or str(cause)
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError as e:
            self.broken = JournalWriteError(
                f"{self.path}: a write failed ({what}) and its partial record could not be cut back "
                f"({e.strerror or e}); this gateway records no more calls: restart it (recovery cuts the "
                "partial record)"
            )
            logger.error("%s", self.broken)
            return self.broken
        logger.error("%s: journal write failed (%s); cut back to the last complete record", self.path, what)
        return JournalWriteError(f"the gateway could not journal this call ({what}); it was not recorded")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout=10)
        os.close(self._fd)
        self._lock.close()


def _resolve(fut: asyncio.Future[None], err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
