"""One timer for many waits of one length: each wait ends as it would under ``asyncio.timeout``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from gateway.upstream.deadline import Deadlines, wait_until

LIMIT = 0.05


async def _outcome(limited: Callable[[Awaitable[None]], Awaitable[None]], work: Awaitable[None]) -> str:
    try:
        await limited(work)
    except TimeoutError:
        return "timeout"
    except asyncio.CancelledError:
        return "cancelled"
    except ValueError:
        return "raised"
    return "done"


async def _under_asyncio(work: Awaitable[None]) -> None:
    async with asyncio.timeout(LIMIT):
        await work


def _under(deadlines: Deadlines) -> Callable[[Awaitable[None]], Awaitable[None]]:
    async def limited(work: Awaitable[None]) -> None:
        with deadlines.wait():
            await work

    return limited


async def _scenario(limited: Callable[[Awaitable[None]], Awaitable[None]], kind: str) -> tuple[str, int]:
    """Run one wait in a task of its own; what it ended in, and the task's pending cancellations."""

    async def body() -> tuple[str, int]:
        task = asyncio.current_task()
        assert task is not None
        if kind == "in time":
            outcome = await _outcome(limited, asyncio.sleep(LIMIT / 5))
        elif kind == "too long":
            outcome = await _outcome(limited, asyncio.sleep(10))
        elif kind == "raises":
            outcome = await _outcome(limited, _raise_later())
        else:  # cancelled by someone else, before or after the limit is reached
            delay = LIMIT / 5 if kind == "cancelled early" else LIMIT * 2

            async def shielded_sleep() -> None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(10)  # the limit's cancellation is swallowed: the other one stays
                await asyncio.sleep(10)

            asyncio.get_running_loop().call_later(delay, task.cancel)
            outcome = await _outcome(
                limited, shielded_sleep() if kind == "cancelled late" else asyncio.sleep(10)
            )
        return outcome, task.cancelling()

    return await asyncio.create_task(body())


async def _raise_later() -> None:
    await asyncio.sleep(LIMIT / 5)
    raise ValueError("not a time-out")


@pytest.mark.parametrize("kind", ["in time", "too long", "raises", "cancelled early", "cancelled late"])
async def test_a_wait_ends_as_under_asyncio_timeout(kind: str) -> None:
    expected = await _scenario(_under_asyncio, kind)
    deadlines = Deadlines(LIMIT)
    assert await _scenario(_under(deadlines), kind) == expected
    assert not deadlines._waits


async def _until(work: Awaitable[None]) -> None:
    with wait_until(asyncio.get_running_loop().time() + LIMIT):
        await work


@pytest.mark.parametrize("kind", ["in time", "too long", "raises", "cancelled early", "cancelled late"])
async def test_a_wait_until_a_time_ends_as_under_asyncio_timeout(kind: str) -> None:
    assert await _scenario(_until, kind) == await _scenario(_under_asyncio, kind)


async def test_many_waits_share_one_timer_and_only_the_late_ones_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        if callback == deadlines._expire:
            armed.append(when)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    deadlines = Deadlines(0.2)
    limited = _under(deadlines)
    quick = [asyncio.create_task(_outcome(limited, asyncio.sleep(0.01 * (i % 5)))) for i in range(200)]
    slow = [asyncio.create_task(_outcome(limited, asyncio.sleep(5))) for _ in range(3)]
    assert await asyncio.gather(*quick) == ["done"] * 200
    assert await asyncio.gather(*slow) == ["timeout"] * 3
    # one timer for the first wait, armed again only for a slow wait that began a moment later
    assert 1 <= len(armed) <= 2
    assert not deadlines._waits and deadlines._live == 0


async def test_waits_finished_behind_a_long_one_are_not_kept() -> None:
    deadlines = Deadlines(30)
    limited = _under(deadlines)
    long = asyncio.create_task(_outcome(limited, asyncio.sleep(0.5)))
    await asyncio.sleep(0)
    for _ in range(2000):
        await _outcome(limited, asyncio.sleep(0))
    assert deadlines._live == 1 and len(deadlines._waits) <= 2 + 64
    assert await long == "done"
    assert not deadlines._waits
    deadlines.close()


def test_a_new_event_loop_starts_afresh() -> None:
    deadlines = Deadlines(LIMIT)

    async def late() -> str:
        return await _outcome(_under(deadlines), asyncio.sleep(1))

    assert asyncio.run(late()) == "timeout"
    assert uvloop.run(late()) == "timeout"
    assert asyncio.run(_outcome(_under(deadlines), asyncio.sleep(0))) == "done"


async def test_a_timer_that_runs_early_still_ends_the_wait_it_was_set_for() -> None:
    deadlines = Deadlines(30)  # far off: the test runs the timer itself, as if it were due
    limited = _under(deadlines)
    first = asyncio.create_task(_outcome(limited, asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(_outcome(limited, asyncio.sleep(10)))
    await asyncio.sleep(0)
    assert deadlines._handle is not None
    deadlines._handle.cancel()
    deadlines._expire()  # "now" is 30 s before the first deadline: the event loop ran it early
    assert await first == "timeout"
    assert not second.done() and deadlines._handle is not None  # armed again, for the second wait
    second.cancel()
    deadlines.close()
