"""Journal writes that fail: a disk-full write used to leave a partial line mid-file while the gateway kept
acknowledging calls; it then refused to start and `export` failed. Now a failed write is cut back to the last
complete record and its call gets a JSON 503 (nothing acknowledged that is not durable); a journal damaged
before (a cut-off write, glued to the next record; garbage; a duplicated line) is read in salvage mode by
`export --salvage` and `serve --salvage`, keeping every complete record and reporting what was dropped."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from harnessrl.cli import main as cli_main
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin
from harnessrl.gateway.enums import NoticeKind
from harnessrl.gateway.journal import Journal, JournalCorruptError, JournalWriteError, read_journal
from harnessrl.gateway.records import NoticeRecord
from tests.gateway.support import ADMIN, call_records, send

MSGS = [{"role": "user", "content": "List the files."}]


def _chat(s, text: str = "List the files.") -> int:
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": text}], "max_tokens": 8})
    reply = send(s.openai_base_url + "/chat/completions", body.encode(), s.api_key)
    if reply.status != 200:
        assert "journal" in reply.error() and reply.headers["Retry-After"] == "2"
    return reply.status


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {e}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fills the file system, then frees `leave` bytes: the next large write gets part way, then ENOSPC."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        size = 0
        while True:
            try:
                size += os.write(fd, b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        os.ftruncate(fd, max(size - leave, 0))
    finally:
        os.close(fd)
    return filler


def test_disk_full_on_a_real_file_system(gateway, fast_engine, tmp_path):
    with _tmpfs(tmp_path / "disk", "256k") as disk:
        g, admin = gateway(HTTPEngine(fast_engine().base_url), journal=disk / "journal", drift_check_every=0)
        s = admin.create_session("r", "t")
        assert _chat(s) == 200
        filler = _fill(disk, leave=8192)
        big = "lots of tool output " * 3000  # a record of ~80 kB: 8 kB of it fit
        assert _chat(s, big) == 503
        assert (disk / "journal" / "journal.jsonl").read_bytes().endswith(b"\n")  # cut back, no partial line
        assert admin.metrics()["journal_write_failures"] >= 1
        assert admin.session(s.session_id)["status"] == "active"
        filler.unlink()  # space is back
        assert _chat(s, big) == 200
        assert _chat(s) == 200
        g.stop()
        assert len(call_records(disk / "journal")) == 3  # exactly the acknowledged calls, strict read
        g2, admin2 = gateway(HTTPEngine(fast_engine().base_url), journal=disk / "journal")
        assert admin2.metrics()["recovered_calls"] == 3
        g2.stop()


def _notice(i: int) -> NoticeRecord:
    return NoticeRecord("s", NoticeKind.CONTEXT_EXHAUSTED, i)


class _FailingWrites:
    """os.write / os.ftruncate of one file descriptor fail like a full disk (half the bytes, then ENOSPC)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fd: int, truncate_fails: bool = False) -> None:
        self.fd, real_write, real_truncate = fd, os.write, os.ftruncate

        def write(f: int, data) -> int:
            if f == self.fd and self.on:
                real_write(f, bytes(data[: len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(f, data)

        def ftruncate(f: int, length: int) -> None:
            if f == self.fd and self.on and truncate_fails:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_truncate(f, length)

        self.on = True
        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "ftruncate", ftruncate)


def test_a_failed_write_is_cut_back_and_not_acknowledged(tmp_path, monkeypatch):
    async def run() -> None:
        j = Journal(tmp_path)
        try:
            await j.append(_notice(1))
            failing = _FailingWrites(monkeypatch, j._fd)
            with pytest.raises(JournalWriteError, match="No space left"):
                await asyncio.gather(j.append(_notice(2)), j.append(_notice(3)))
            assert (tmp_path / "journal.jsonl").read_bytes().count(b"\n") == 1
            failing.on = False
            await j.append(_notice(4))
            assert j.write_failures == 1 and j.broken is None
        finally:
            j.close()

    asyncio.run(run())
    assert [r.prompt_tokens for r in read_journal(tmp_path) if isinstance(r, NoticeRecord)] == [1, 4]


def test_a_write_that_cannot_be_cut_back_stops_the_gateway_acknowledging(gateway, fast_engine, monkeypatch):
    g, admin = gateway(HTTPEngine(fast_engine().base_url))
    s = admin.create_session("r", "t")
    assert _chat(s) == 200
    _FailingWrites(monkeypatch, g.parts.journal._fd, truncate_fails=True)
    assert _chat(s) == 503
    monkeypatch.undo()  # the disk is fine again, but the file holds a partial record: refuse, do not append
    assert _chat(s) == 503
    health = send(admin.base_url + "/health", method="GET")
    assert health.status == 503 and "restart" in health.json()["journal_error"]
    assert admin.metrics()["journal_broken"] is True


def _damaged_journal(gateway, fast_engine, journal: Path) -> tuple[list[str], bytes]:
    """A real journal (3 sessions, 6 calls), then damaged the ways a disk-full write under the old gateway and a
    careless copy do: a cut-off record glued to the next line, a garbage line, a duplicated line."""
    g, admin = gateway(HTTPEngine(fast_engine().base_url), journal=journal)
    for i in range(3):
        s = admin.create_session(f"r{i}", "g")
        assert _chat(s) == 200
        assert _chat(s, "and now?") == 200
    g.stop()
    calls = [r.call_id for r in call_records(journal)]
    lines = (journal / "journal.jsonl").read_bytes().splitlines(keepends=True)
    call_lines = [i for i, line in enumerate(lines) if b'"type":"call"' in line]
    lines.insert(call_lines[3], lines[call_lines[1]][:150])  # cut off (no newline): glued to the next record
    lines.insert(call_lines[2], b"\x00\x00\x00 not json\n")
    lines.append(lines[call_lines[0]])  # the same call twice
    (journal / "journal.jsonl").write_bytes(b"".join(lines))
    return calls, b"".join(lines)


def test_export_refuses_a_damaged_journal_unless_salvaging(gateway, fast_engine, tmp_path, capsys):
    journal = tmp_path / "j"
    calls, _ = _damaged_journal(gateway, fast_engine, journal)
    assert cli_main(["gateway", "export", "--journal", str(journal), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "journal.jsonl:" in err and "corrupt journal line" in err and "--salvage" in err
    out = tmp_path / "out"
    cmd = ["gateway", "export", "--journal", str(journal), "--out", str(out), "--salvage"]
    assert cli_main(cmd) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])["journal"]
    assert [line for line, _ in report["dropped"]] and len(report["dropped"]) == 1
    assert len(report["recovered"]) == 1 and "cut-off write" in report["recovered"][0][1]
    assert len(report["duplicates"]) == 1
    exported = pd.read_parquet(out / "records.parquet")["call_id"].tolist()
    assert sorted(exported) == sorted(calls)  # every acknowledged call, once (the glued one recovered)


def test_a_duplicated_line_is_exported_once_and_reported(gateway, fast_engine, tmp_path, capsys):
    g, admin = gateway(HTTPEngine(fast_engine().base_url))
    s = admin.create_session("r", "t")
    assert _chat(s) == 200
    g.stop()
    path = g.journal_dir / "journal.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines + lines[-1:]))
    assert cli_main(["gateway", "export", "--journal", str(g.journal_dir), "--out", str(tmp_path / "o")]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["records"] == 1 and result["journal"]["duplicates"][0][0] == len(lines) + 1
    assert pd.read_parquet(tmp_path / "o" / "records.parquet")["call_id"].is_unique


def test_serve_refuses_a_damaged_journal_unless_salvaging(gateway, fast_engine, tmp_path):
    journal = tmp_path / "j"
    calls, damaged = _damaged_journal(gateway, fast_engine, journal)
    with pytest.raises(JournalCorruptError, match=r"journal.jsonl:\d+: corrupt journal line.*--salvage"):
        gateway(HTTPEngine(fast_engine().base_url), journal=journal)
    g, admin = gateway(HTTPEngine(fast_engine().base_url), journal=journal, salvage=True)
    metrics = admin.metrics()
    assert metrics["recovered_calls"] == len(calls) and metrics["salvaged_dropped_lines"] == 1
    [backup] = journal.glob("journal.jsonl.corrupt-*")
    assert backup.read_bytes() == damaged  # the original, kept as it was
    [report] = journal.glob("salvage-*.json")
    assert len(json.loads(report.read_text())["dropped"]) == 1
    assert [r.call_id for r in call_records(journal)] == calls  # rewritten clean: a strict read works
    s = admin.create_session("r-after", "g")
    assert _chat(s) == 200


def test_serve_command_names_the_line_and_starts_with_salvage(gateway, fast_engine, tmp_path):
    journal = tmp_path / "j"
    _damaged_journal(gateway, fast_engine, journal)
    cmd = [sys.executable, "-m", "harnessrl.cli", "gateway", "serve", "--engine-url", fast_engine().base_url]
    cmd += ["--journal", str(journal), "--admin-token", ADMIN]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (
        refused.returncode == 2 and "corrupt journal line" in refused.stderr and "--salvage" in refused.stderr
    )
    proc = subprocess.Popen([*cmd, "--salvage"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        assert GatewayAdmin(line.split()[1], ADMIN).metrics()["salvaged_dropped_lines"] == 1
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.stderr is not None and "corrupt lines dropped (lines " in proc.stderr.read()
