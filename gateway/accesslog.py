"""The access log: one JSON line per request, written by a thread so the event loop never waits on stdout.

A blocking ``write`` + ``flush`` per request on the event loop cost a system call per request (~8 % of
the gateway's CPU at 500 req/s) and stalled every request in flight whenever stdout was slow (a full
pipe, a busy log collector). Here the loop only appends the line's record to a queue; a writer thread
serialises what has gathered and writes it in a few large writes.

Guarantees:

- every line is whole: a write holds complete lines only, and at most :data:`ATOMIC_WRITE` bytes
  (``PIPE_BUF`` on Linux), so with several workers sharing one stdout pipe their lines never
  interleave mid-line (a single line longer than that gets a write of its own);
- lines keep the order in which requests finished (one queue, one writer);
- :meth:`AccessLog.close` (at shutdown, and at interpreter exit as a fallback) writes everything
  queued before it returns, so no line is lost on a graceful stop.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

import orjson

#: the most bytes one write carries: what the kernel writes to a pipe in one piece
ATOMIC_WRITE = 4096
#: how long the writer lets lines gather after the first one arrives: fewer, larger writes under load,
#: and a line reaches the log within this much of its request's end
GATHER_S = 0.005

_STOP = object()


class AccessLog:
    """A queue of access-log records and the thread that writes them to ``stream`` (default: stdout).

    ``stream`` is looked up at each write when not given, so a replaced ``sys.stdout`` (a test's
    capture) receives the lines.
    """

    def __init__(self, stream: Callable[[], IO[str]] | None = None, gather_s: float = GATHER_S):
        self._stream = stream or (lambda: sys.stdout)
        self._gather_s = gather_s
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def write(self, record: dict[str, object]) -> None:
        """Queue one line; the writer thread starts on the first one."""
        if self._thread is None:
            self._start()
        self._queue.put(record)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._closed = False
            self._thread = threading.Thread(target=self._run, name="specroute-access-log", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write every line queued so far, then stop the writer; a later line starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(_STOP)
        thread.join(timeout_s)
        atexit.unregister(self.close)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every line queued so far has been written (the writer keeps running)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout_s)

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            items = [get()]
            if self._gather_s:
                time.sleep(self._gather_s)
            with contextlib.suppress(queue.Empty):
                while True:
                    items.append(get_nowait())
            stop = self._write(items)
            if stop:
                return

    def _write(self, items: list[object]) -> bool:
        """Write the records among ``items``; set the flush markers once written; True on the stop marker."""
        lines: list[bytes] = []
        markers: list[threading.Event] = []
        stop = False
        for item in items:
            if isinstance(item, dict):
                lines.append(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE))
            elif isinstance(item, threading.Event):
                markers.append(item)
            elif item is _STOP:
                stop = True
        if lines:
            # stdout closed or gone: those lines are lost, serving goes on
            with contextlib.suppress(OSError, ValueError):
                _write_lines(self._stream(), lines)
        for marker in markers:
            marker.set()
        return stop


def _write_lines(stream: IO[str], lines: list[bytes]) -> None:
    """Write ``lines`` in pieces of whole lines of at most :data:`ATOMIC_WRITE` bytes, each flushed."""
    binary = getattr(stream, "buffer", None)
    piece: list[bytes] = []
    size = 0
    for line in lines:
        if piece and size + len(line) > ATOMIC_WRITE:
            _emit(stream, binary, b"".join(piece))
            piece, size = [], 0
        piece.append(line)
        size += len(line)
    if piece:
        _emit(stream, binary, b"".join(piece))


def _emit(stream: IO[str], binary: IO[bytes] | None, data: bytes) -> None:
    if binary is not None:
        stream.flush()  # anything written to the text layer goes first
        binary.write(data)
        binary.flush()
    else:
        stream.write(data.decode())
        stream.flush()
