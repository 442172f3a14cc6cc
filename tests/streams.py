"""Streams drawn for tests: the tokens per chunk a speculative server sends."""

from __future__ import annotations

import random


def cut_stream(alpha: float, k: int, max_tokens: int, rng: random.Random) -> list[int]:
    """Tokens per chunk of one stream that ``max_tokens`` cuts (the prefill token first): each step
    accepts drafts while a draw falls under ``alpha``, at most ``k``, then adds the target's token."""
    tokens, total = [1], 1
    while total < max_tokens:
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        tokens.append(min(a + 1, max_tokens - total))
        total += tokens[-1]
    return tokens
