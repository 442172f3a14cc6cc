"""The access log's writer thread: whole lines, in order, nothing lost at shutdown, never on the loop."""

from __future__ import annotations

import io
import multiprocessing
import os
import threading
import time
from typing import IO

import orjson
import pytest

from gateway.accesslog import ATOMIC_WRITE, AccessLog


class Recording(io.StringIO):
    """A text stream that remembers each write separately (each is one system call on a real file)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def _records(n: int, pad: int = 0) -> list[dict[str, object]]:
    return [{"request_id": f"r{i}", "status": 200, "pad": "x" * pad} for i in range(n)]


def test_every_line_is_written_whole_and_in_order_by_close() -> None:
    out = Recording()
    log = AccessLog(lambda: out)
    records = _records(500, pad=100)
    for rec in records:
        log.write(rec)
    log.close()  # the shutdown path: returns only when everything queued is out
    assert [orjson.loads(line) for line in out.getvalue().splitlines()] == records
    assert all(w.endswith("\n") for w in out.writes)  # no write ends inside a line
    assert len(out.writes) < len(records)  # gathered into fewer writes than lines


def test_writes_stay_within_one_atomic_pipe_write() -> None:
    """Several workers share stdout: a write longer than PIPE_BUF could interleave with another's."""
    out = Recording()
    log = AccessLog(lambda: out)
    for rec in _records(300, pad=300):
        log.write(rec)
    log.write({"request_id": "big", "pad": "y" * (2 * ATOMIC_WRITE)})
    log.close()
    big = [w for w in out.writes if "big" in w]
    assert len(big) == 1 and big[0].count("\n") == 1  # an oversized line goes alone
    assert all(len(w.encode()) <= ATOMIC_WRITE for w in out.writes if "big" not in w)
    assert len(out.getvalue().splitlines()) == 301


def test_the_caller_never_waits_for_the_stream() -> None:
    """A stalled stdout (full pipe, slow collector) holds the writer thread, not the event loop."""
    release = threading.Event()

    class Stalled(Recording):
        def write(self, s: str) -> int:
            release.wait(5)
            return super().write(s)

    out = Stalled()
    log = AccessLog(lambda: out, gather_s=0)
    log.write({"request_id": "first"})
    for rec in _records(100):  # queued while the first write is stuck
        log.write(rec)
    assert out.getvalue() == ""
    release.set()
    log.close()
    assert len(out.getvalue().splitlines()) == 101


def test_flush_waits_for_the_lines_queued_before_it(capsys: pytest.CaptureFixture[str]) -> None:
    log = AccessLog()  # sys.stdout, looked up at write time: here the test's capture
    log.write({"request_id": "a"})
    log.flush()
    assert orjson.loads(capsys.readouterr().out) == {"request_id": "a"}
    log.write({"request_id": "b"})
    log.close()
    assert orjson.loads(capsys.readouterr().out) == {"request_id": "b"}


def test_a_closed_stream_loses_the_log_but_not_the_writer() -> None:
    closed: IO[str] = io.StringIO()
    closed.close()
    log = AccessLog(lambda: closed, gather_s=0)
    log.write({"request_id": "lost"})
    log.flush()
    out = Recording()
    log._stream = lambda: out  # the stream comes back (e.g. a reopened file)
    log.write({"request_id": "kept"})
    log.close()
    assert orjson.loads(out.getvalue()) == {"request_id": "kept"}


def test_lines_after_close_start_a_new_writer() -> None:
    out = Recording()
    log = AccessLog(lambda: out, gather_s=0)
    log.write({"n": 1})
    log.close()
    log.write({"n": 2})
    log.close()
    assert [orjson.loads(x)["n"] for x in out.getvalue().splitlines()] == [1, 2]


def test_a_stdout_no_one_reads_holds_a_bounded_queue_and_counts_what_it_drops() -> None:
    """A stuck log collector must not grow the gateway's memory until it is killed: past the bound, a
    line is dropped and counted, and the caller still never waits."""
    release = threading.Event()

    class Stalled(Recording):
        def write(self, s: str) -> int:
            release.wait(5)
            return super().write(s)

    drops: list[int] = []
    out = Stalled()
    log = AccessLog(lambda: out, gather_s=0, max_queued=10, on_drop=lambda: drops.append(1))
    log.write({"request_id": "first"})
    deadline = time.monotonic() + 5
    while log._lines and time.monotonic() < deadline:  # the writer took the first line and is stuck
        time.sleep(0.001)
    for rec in _records(25):
        log.write(rec)
    assert log.dropped == len(drops) == 15
    release.set()
    log.close()
    lines = [orjson.loads(x)["request_id"] for x in out.getvalue().splitlines()]
    assert lines == ["first"] + [f"r{i}" for i in range(10)]  # the oldest kept, in order


def _write_long_lines(write_fd: int, tag: int, count: int) -> None:
    """One worker: ``count`` access-log lines far longer than an atomic pipe write, to a shared pipe."""
    stream = os.fdopen(write_fd, "w", closefd=False)
    log = AccessLog(lambda: stream, gather_s=0.0)
    for i in range(count):
        log.write({"worker": tag, "i": i, "prompt": f"{tag}" * (3 * ATOMIC_WRITE)})
    log.close()


def test_workers_sharing_a_stdout_pipe_take_turns_with_lines_longer_than_an_atomic_write() -> None:
    """A line over ``PIPE_BUF`` (a logged prompt) may go into a pipe in several pieces: another
    worker's write landed between them while a slow reader (a log collector) kept the pipe full, and
    the lines were no longer JSON. The workers hold the pipe's lock while they write."""
    read_fd, write_fd = os.pipe()
    fork = multiprocessing.get_context("fork")
    workers = [fork.Process(target=_write_long_lines, args=(write_fd, tag, 40)) for tag in (1, 2)]
    for w in workers:
        w.start()
    os.close(write_fd)
    received = b""
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read1(3000):  # a reader slower than the writers, as a collector may be
            received += chunk
            time.sleep(0.0005)
    for w in workers:
        w.join(30)
    lines = [orjson.loads(line) for line in received.splitlines()]  # every one whole JSON
    assert sorted((r["worker"], r["i"]) for r in lines) == [(t, i) for t in (1, 2) for i in range(40)]
