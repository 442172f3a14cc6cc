"""Time limits of one length for many concurrent waits, kept by a single timer.

``asyncio.timeout`` arms a timer when a wait begins and cancels it when the wait ends: about 4.5 µs
per request on uvloop, whose timers are libuv handles, and every forwarded request waits once for its
upstream's first byte. Waits of one length end their allowance in the order they began, so one timer,
armed for the oldest wait still going, serves them all: when it fires, the finished waits in front are
dropped, each wait past its time is cancelled as ``asyncio.timeout`` cancels it (its task is cancelled,
and the wait ends in :class:`TimeoutError` unless something else cancelled the task too), and the timer
is armed again for the next unfinished wait. A wait that ends in time costs an append and a flag.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class Deadlines:
    """Waits of ``seconds`` each: ``with deadlines.wait(): ...`` around the wait, in the waiting task.

    Finished waits are dropped from the front as the oldest one ends, and all at once when they
    outnumber the unfinished ones (a long wait in front holds back the ones behind it).
    """

    __slots__ = ("_armed", "_handle", "_live", "_loop", "_waits", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waits: deque[Wait] = deque()
        self._live = 0
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0.0  # the time the timer is set for
        self._loop: asyncio.AbstractEventLoop | None = None

    def wait(self) -> Wait:
        """A wait of :attr:`seconds` from now, for the current task."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop: the old one's waits and timer went with it
            self._waits = deque()
            self._handle = None
            self._loop = loop
        task = asyncio.current_task(loop)
        assert task is not None
        return Wait(self, loop.time() + self.seconds, task)

    def close(self) -> None:
        """Stop the timer (the event loop is ending); waits still going are no longer limited."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _begin(self, wait: Wait) -> None:
        self._waits.append(wait)
        self._live += 1
        if self._handle is None:
            self._arm(wait.deadline)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        self._armed = when
        self._handle = self._loop.call_at(when, self._expire)

    def _end(self) -> None:
        self._live -= 1
        waits = self._waits
        while waits and waits[0].done:
            waits.popleft()
        if len(waits) > 2 * self._live + 64:
            self._waits = deque(w for w in waits if not w.done)

    def _expire(self) -> None:
        self._handle = None
        assert self._loop is not None
        # uvloop runs a timer up to half a millisecond before its time (it counts whole milliseconds);
        # what the timer was set for is due then, as asyncio.timeout's own timer would have it
        due = max(self._loop.time(), self._armed)
        waits = self._waits
        while waits:
            wait = waits[0]
            if not wait.done:
                if wait.deadline > due:
                    self._arm(wait.deadline)
                    return
                _expire(wait)
            waits.popleft()


def wait_until(deadline: float) -> Wait:
    """A wait that ends at ``deadline`` (on the loop's clock), with a timer of its own.

    For the rare wait whose end is not a fixed time after its start (a retry, cut at its request's
    deadline): ``asyncio.timeout_at`` for a plain ``with`` block, ending as a :class:`Deadlines` wait ends.
    """
    task = asyncio.current_task()
    assert task is not None
    return Wait(_OwnTimer(), deadline, task)


class _OwnTimer:
    """The timer of one :func:`wait_until` wait, in the place of a :class:`Deadlines`."""

    __slots__ = ("_handle",)

    def _begin(self, wait: Wait) -> None:
        self._handle = asyncio.get_running_loop().call_at(wait.deadline, _expire, wait)

    def _end(self) -> None:
        self._handle.cancel()


def _expire(wait: Wait) -> None:
    wait.expired = True
    wait.task.cancel()


class Wait:
    """One wait under a :class:`Deadlines` limit (a context manager, entered once)."""

    __slots__ = ("_cancelling", "_deadlines", "deadline", "done", "expired", "task")

    def __init__(self, deadlines: Deadlines | _OwnTimer, deadline: float, task: asyncio.Task[object]) -> None:
        self._deadlines = deadlines
        self.deadline = deadline
        self.task = task
        self.done = False
        self.expired = False
        self._cancelling = 0

    def cut(self) -> None:
        """End the wait now, as its time running out would: the waiting task gets TimeoutError."""
        if not self.done and not self.expired:
            _expire(self)

    def __enter__(self) -> Wait:
        self._cancelling = self.task.cancelling()
        self._deadlines._begin(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.done = True
        self._deadlines._end()
        # as asyncio.timeout: its own cancellation becomes TimeoutError, anyone else's passes through
        if self.expired and self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
