"""The silence timer: a wait longer than the gap (or past the deadline) times out; pieces in time never do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.upstream.silence import Silence


async def _paced(delays: list[float]) -> AsyncIterator[bytes]:
    for i, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield b"%d" % i


async def _read_all(silence: Silence, pieces: AsyncIterator[bytes]) -> list[bytes]:
    out = []
    try:
        while True:
            out.append(await silence.next(pieces))
    except StopAsyncIteration:
        return out
    finally:
        silence.close()


async def test_pieces_in_time_never_time_out_however_long_the_whole() -> None:
    silence = Silence(gap_s=0.2)
    got = await _read_all(silence, _paced([0.05] * 8))  # 0.4 s in all, twice the gap
    assert got == [b"%d" % i for i in range(8)]


async def test_a_silence_longer_than_the_gap_is_a_timeout_and_the_task_goes_on() -> None:
    silence = Silence(gap_s=0.05)
    pieces = _paced([0.0, 0.0, 5.0])
    assert await silence.next(pieces) == b"0"
    assert await silence.next(pieces) == b"1"
    with pytest.raises(TimeoutError):
        await silence.next(pieces)
    silence.close()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the cancellation was taken back
    await asyncio.sleep(0)  # and the task is not cancelled at its next await


async def test_the_deadline_ends_a_stream_whose_pieces_each_come_in_time() -> None:
    loop = asyncio.get_running_loop()
    silence = Silence(gap_s=1.0, deadline=loop.time() + 0.15)
    pieces = _paced([0.05] * 20)
    got = []
    with pytest.raises(TimeoutError):
        while True:
            got.append(await silence.next(pieces))
    silence.close()
    assert 1 <= len(got) < 20


async def test_a_cancellation_from_elsewhere_passes_through() -> None:
    async def reader() -> None:
        silence = Silence(gap_s=5.0)
        try:
            await silence.next(_paced([5.0]))
        finally:
            silence.close()

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_one_timer_serves_many_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of it: no timer per piece (``asyncio.timeout`` arms and cancels one each)."""
    loop = asyncio.get_running_loop()
    armed = 0
    call_at = loop.call_at

    def counting(when: float, callback, *args):  # type: ignore[no-untyped-def]
        nonlocal armed
        armed += 1
        return call_at(when, callback, *args)

    monkeypatch.setattr(loop, "call_at", counting)
    silence = Silence(gap_s=30.0)
    assert len(await _read_all(silence, _paced([0.0] * 200))) == 200
    assert armed == 1
