"""Append-only JSONL journal with group commit: `await append(rec)` returns once the record is fsynced.

One writer thread takes every record queued since its last fsync, writes them in one go and fsyncs once,
so N concurrent calls cost one fsync, not N. On open, a torn last line (a write cut by a crash; it was never
acknowledged) is cut off; everything before it is returned by `replay()`. One gateway per journal directory
(an exclusive lock says so clearly instead of interleaving two writers).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

JOURNAL_NAME = "journal.jsonl"


class JournalLockedError(RuntimeError):
    pass


def read_journal(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yields the complete records of a journal file (a directory or the file itself); skips a torn tail."""
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
    if not p.exists():
        raise FileNotFoundError(f"{p}: no gateway journal here (is the journal directory right?)")
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # torn tail: never acknowledged
            try:
                yield loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{p}:{lineno}: corrupt journal line ({e.msg}); "
                    "only the last line may be torn — restore this file from a backup"
                ) from None


def loads(data: bytes | str) -> Any:
    """orjson's parse (several times faster); the stdlib's for what orjson rejects (NaN / Infinity literals,
    written by `encode_record` for non-finite logprobs), so errors and accepted inputs stay the stdlib's."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def encode_record(rec: dict[str, Any]) -> bytes:
    """One journal line: compact UTF-8 JSON (what `json.dumps(ensure_ascii=False, separators=(",", ":"))`
    writes), by orjson: serializing a record's token id lists is the largest part of journaling.
    orjson writes NaN / ±inf as null, so a record with a non-finite logprob (the only floats that do not come
    from our own clocks) goes through the stdlib, which keeps them readable as NaN / -Infinity."""
    lps = rec.get("completion_logprobs")
    if lps and not math.isfinite(sum(lps)):
        return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)


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
        self._q: queue.SimpleQueue = queue.SimpleQueue()
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
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def replay(self) -> Iterator[dict[str, Any]]:
        return read_journal(self.path)

    async def append(self, rec: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        line = encode_record(rec)
        self._q.put((line, fut, loop))
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


def _resolve(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
