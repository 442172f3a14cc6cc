"""The longest silence allowed while a response is read piece by piece, with one timer per silence period.

A stream of 20 chunks read under ``asyncio.timeout`` per chunk creates, schedules and cancels 20 timers
(about 4 µs each here, a tenth of the gateway's CPU on a streamed or assembled request). Here a single
timer is armed when a wait begins and, when it fires, looks at how long the current wait has lasted:
past the allowance it cancels the reading task the way ``asyncio.timeout`` does, otherwise it re-arms
for the moment the current wait would run out. Pieces that arrive in time cost two attribute writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class Silence:
    """Raises :class:`TimeoutError` from :meth:`next` when a wait lasts ``gap_s`` or runs past ``deadline``.

    Made in the task that reads (the one it cancels); ``deadline`` is on the loop's clock. A
    cancellation from elsewhere (a client that went away) passes through as it is. :meth:`close`
    when done reading.
    """

    __slots__ = ("_deadline", "_expired", "_gap_s", "_handle", "_loop", "_since", "_task", "_waiting")

    def __init__(self, gap_s: float, deadline: float = float("inf")):
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._gap_s = gap_s
        self._deadline = deadline
        self._since = 0.0
        self._waiting = False
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None

    async def next(self, pieces: AsyncIterator[bytes]) -> bytes:
        """The next piece of ``pieces`` (``StopAsyncIteration`` at its end)."""
        self._since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(min(self._since + self._gap_s, self._deadline), self._check)
        self._waiting = True
        try:
            return await anext(pieces)
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if self._task.uncancel() == 0:  # only this timer cancelled: it is a time-out
                    raise TimeoutError from None
            raise
        finally:
            self._waiting = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if not self._waiting:
            return  # between waits: the next wait arms the timer again
        due = min(self._since + self._gap_s, self._deadline)
        if self._loop.time() >= due:
            self._expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)
