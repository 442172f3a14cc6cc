"""How long to wait before retrying an upstream request: capped exponential back-off with full jitter.

When an endpoint fails, every request in flight to it fails at about the same moment and retries. With
a fixed delay they stay in lockstep and reach the next endpoint together; a random delay in
``[0, ceiling]`` ("full jitter") spreads them over the window, and the ceiling doubling per retry, up
to a cap, backs off further while failures go on.

Why not tenacity or backoff: both drive the retry loop themselves (decorators, or tenacity's per-call
``RetryCallState`` that its wait functions read). The gateway's loop picks another endpoint per try,
fails over between pools and counts tries across resends and resumed streams, so all it would take
from either is this one line of arithmetic, at the cost of a state object per retry.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def retry_delay(
    retry: int, base_s: float, cap_s: float, uniform: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before the ``retry``-th retry (1 = the first one).

    Uniform in ``[0, min(cap_s, base_s * 2 ** (retry - 1))]``, drawn with ``uniform`` (a source of
    floats in ``[0, 1)``; tests pass a seeded one). No wait when ``base_s`` is 0 or before a first try.
    """
    if retry < 1 or base_s <= 0:
        return 0.0
    ceiling = min(cap_s, base_s * 2.0 ** min(retry - 1, 64))
    return uniform() * ceiling
