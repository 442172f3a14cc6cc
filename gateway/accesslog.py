"""The access log: one JSON line per request, written by a thread so the event loop never waits on stdout.

A blocking ``write`` + ``flush`` per request on the event loop cost a system call per request (~8 % of
the gateway's CPU at 500 req/s) and stalled every request in flight whenever stdout was slow (a full
pipe, a busy log collector). Here the loop only appends the line's record to a queue; a writer thread
serialises what has gathered and writes it in a few large writes.

Guarantees:

- every line is whole: a write holds complete lines only, and at most :data:`ATOMIC_WRITE` bytes
  (``PIPE_BUF`` on Linux), which the kernel writes to a pipe in one piece. A single line longer than
  that (a logged prompt) gets a write of its own, which a pipe may take in several pieces, and another
  worker's write could land between them: on a pipe the writer holds an exclusive ``flock`` of the
  pipe while it writes (taken on a descriptor of its own: every worker inherits stdout's, and locks
  of one descriptor do not exclude each other), so the workers sharing one stdout pipe take turns;
- lines keep the order in which requests finished (one queue, one writer);
- :meth:`AccessLog.close` (at shutdown, and at interpreter exit as a fallback) writes everything
  queued before it returns, so no line is lost on a graceful stop;
- the queue holds at most :data:`MAX_QUEUED` lines: a stdout that stops being read (a log collector
  stuck, a pipe no one drains) would otherwise grow the gateway's memory, a few KB a request, until the
  kernel killed it, losing every line queued and every request in flight. Past the bound a line is
  dropped and counted (``dropped``, and the ``on_drop`` callback: the gateway's
  ``specroute_access_log_dropped_lines_total``), and serving goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import IO

import orjson

#: the most bytes one write carries: what the kernel writes to a pipe in one piece
ATOMIC_WRITE = 4096
#: how long the writer lets lines gather between writes: a line reaches the log within about this
#: much of its request's end, and the writer runs at most 1/GATHER_S times a second however busy the
#: gateway
GATHER_S = 0.02
#: the most lines queued for the writer: about ten seconds of the gateway's highest rate on one core,
#: some hundred MB at the most
MAX_QUEUED = 50_000


class AccessLog:
    """A queue of access-log records and the thread that writes them to ``stream`` (default: stdout).

    The event loop's share is a ``deque.append`` (thread-safe, no lock, no system call) per line, and
    waking the writer when it has gone idle (no line for :data:`GATHER_S`): a queue whose every
    ``put`` wakes a waiting thread cost four futex calls per request, more than the write it replaced.
    ``stream`` is looked up at each write when not given, so a replaced ``sys.stdout`` (a test's
    capture) receives the lines.
    """

    def __init__(
        self,
        stream: Callable[[], IO[str]] | None = None,
        gather_s: float = GATHER_S,
        max_queued: int = MAX_QUEUED,
        on_drop: Callable[[], None] | None = None,
    ):
        self._stream = stream or (lambda: sys.stdout)
        self._gather_s = gather_s
        self._max_queued = max_queued
        self._on_drop = on_drop
        self.dropped = 0  # lines not written because the queue was full
        self._lines: deque[object] = deque()
        self._wake = threading.Event()
        self._awake = False  # a batch is gathering: no need to wake the writer again
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._locked_of: int | None = None  # the stream's descriptor that _locked_fd was opened for
        self._locked_fd: int | None = None

    def write(self, record: dict[str, object]) -> None:
        """Queue one line (or drop and count it, with :data:`MAX_QUEUED` waiting); the writer thread
        starts on the first one."""
        if self._thread is None:
            self._start()
        if len(self._lines) >= self._max_queued:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            return
        self._lines.append(record)
        if not self._awake:
            self._awake = True
            self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="specroute-access-log", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write every line queued so far, then stop the writer; a later line starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop = True
            self._wake.set()
        thread.join(timeout_s)
        atexit.unregister(self.close)
        if self._locked_fd is not None and not thread.is_alive():
            with contextlib.suppress(OSError):
                os.close(self._locked_fd)
            self._locked_of = self._locked_fd = None

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every line queued so far has been written (the writer keeps running)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._lines.append(done)
        self._awake = True
        self._wake.set()
        done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            # awake: every GATHER_S, write what gathered, for as long as lines keep coming, so that
            # under steady traffic the event loop never has to wake this thread
            while True:
                if self._gather_s and not self._stop:
                    time.sleep(self._gather_s)
                items = []
                with contextlib.suppress(IndexError):
                    while True:
                        items.append(self._lines.popleft())
                if items:
                    self._write(items)
                elif self._stop:
                    return
                else:
                    break
            # idle: from here on the next line wakes the writer; one that came in between is seen now
            self._wake.clear()
            self._awake = False
            if self._lines:
                self._awake = True
                self._wake.set()

    def _write(self, items: list[object]) -> None:
        """Write the records among ``items``, then release the flush markers that follow them."""
        lines: list[bytes] = []
        markers: list[threading.Event] = []
        for item in items:
            if isinstance(item, dict):
                lines.append(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE))
            elif isinstance(item, threading.Event):
                markers.append(item)
        if lines:
            # stdout closed or gone: those lines are lost, serving goes on
            with contextlib.suppress(OSError, ValueError):
                stream = self._stream()
                with self._turn(stream):
                    _write_lines(stream, lines)
        for marker in markers:
            marker.set()

    @contextlib.contextmanager
    def _turn(self, stream: IO[str]) -> Iterator[None]:
        """Hold the pipe's exclusive lock while writing to it (see the module's description)."""
        fd = self._lock_fd(stream)
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _lock_fd(self, stream: IO[str]) -> int | None:
        """A descriptor of its own on ``stream``'s pipe, to lock; None where it is no pipe (a file, a
        terminal, a test's capture), or none could be opened."""
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            return None
        if self._locked_fd is not None and self._locked_of == fd:
            return self._locked_fd
        self._locked_of, self._locked_fd = fd, None
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                self._locked_fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return self._locked_fd


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
