"""The features a request's acceptance is predicted from: cheap, hashed into a fixed space.

Acceptance depends on what the draft model can guess of the reply, which is mostly written in the
instruction (its first words: "Repeat ...", "Write a poem ...", "Convert to JSON ..."), on how the
reply is constrained (``response_format``, tools), on sampling (temperature), on the context length
(acceptance falls as the context grows) and on the script (a draft trained mostly on English is
weak on other languages). Each becomes a named feature; names are hashed (CRC-32, stable across
processes) into ``2**HASH_BITS`` slots, so memory stays fixed whatever the traffic.

Word unigrams and bigrams of the first ``WINDOW_WORDS`` words of the instruction share one unit of
weight (each has value 1/√n), so a long instruction does not outvote the other features. Text with
few spaces (Chinese, Japanese, ...) gets character bigrams instead of words.

The whole extraction is a few tens of microseconds in pure Python (``specroute bench learning-cost``
prints it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any
from zlib import crc32

from gateway.types import record

HASH_BITS = 12
SLOTS = 1 << HASH_BITS
#: what the slots mean: bump when a feature's name, value or hashing changes, so that weights learned
#: under the old meaning (``routing.state_file``) are not read as the new one's
SCHEME = 1
MASK = SLOTS - 1
WINDOW_CHARS = 240  # the instruction window: its first characters ...
WINDOW_WORDS = 24  # ... and at most this many words of it
CJK_CHARS = 32  # character bigrams taken from text with few spaces
_WORD = re.compile(r"[a-z0-9_]+|[^\sa-z0-9_]")

#: the slot of each fixed feature, computed once
_FIXED: dict[str, int] = {}


def slot(name: str) -> int:
    s = _FIXED.get(name)
    if s is None:
        s = crc32(name.encode()) & MASK
        if len(_FIXED) < 4096:
            _FIXED[name] = s
    return s


@record
class Features:
    """Hashed slots and their values; the names behind them are read back only to explain the model."""

    slots: tuple[int, ...]
    values: tuple[float, ...]
    fixed: tuple[str, ...]  # the names of the first slots; the window's word grams name the rest
    window: str = ""  # the lowered instruction window
    kind: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        """Each slot's feature name. Built on demand (only a measured request's update keeps them): every
        request pays for its slots, few for their names."""
        return self.fixed + tuple(["w=" + g for g in _grams(self.window)]) if self.window else self.fixed


def _spaced(window: str) -> bool:
    """Text with spaces between its words; Chinese, Japanese and the like get character pairs instead."""
    return window.count(" ") * 12 >= len(window)


def _grams(window: str) -> list[str]:
    """The word grams of the lowered instruction window: its first words and each two neighbours (the
    definition ``_slots.word_slots`` is held to), or the character pairs of text with few spaces."""
    if not _spaced(window):
        return [window[i : i + 2] for i in range(min(CJK_CHARS, len(window) - 1))]
    words = _WORD.findall(window)[:WINDOW_WORDS]
    return words + list(map(" ".join, pairwise(words)))


def _word_slots_c() -> Callable[[str, int, int], tuple[int, ...] | None] | None:
    """The C reader of the window's word slots, or None where the package was built without it."""
    try:
        from gateway.routing._slots import word_slots
    except ImportError:
        return None
    return word_slots


_WORD_SLOTS = _word_slots_c()


#: characters a token stands for, to read a token-id prompt's length on the scale of text prompts
TOKEN_CHARS = 4


def _instruction(body: Mapping[str, Any]) -> tuple[str, int]:
    """The text whose reply is predicted (prompt, or last user turn) and the whole prompt's length."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = 0
        last = ""
        for m in messages[-64:]:
            if not isinstance(m, Mapping):
                continue
            text = _content(m.get("content"))
            total += len(text)
            if m.get("role") == "user":
                last = text
        return last, total
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int) and not isinstance(first, bool):
            # token ids: no words to read, but the context's length still tells (at about four
            # characters a token), where read as an empty prompt every such request was a short one
            return "", TOKEN_CHARS * len(prompt)
        if isinstance(first, list):  # a batch of token-id prompts: the first's length
            return "", TOKEN_CHARS * len(first)
        prompt = next((p for p in prompt[:64] if isinstance(p, str)), "")  # a batch: its first text
    text = prompt if isinstance(prompt, str) else ""
    return text, len(text)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content[:16] if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def extract(body: Mapping[str, Any], kind: str, p_structured: float) -> Features:
    """The request's features; never raises on a malformed body (it has been validated, but loosely)."""
    text, total = _instruction(body)
    window = text[:WINDOW_CHARS].lower()
    temperature = _number(body.get("temperature"))
    t = 1.0 if temperature is None else min(2.0, max(0.0, temperature))  # vLLM's default is 1
    # no constant feature: a weight every request shares would carry what one kind of prompt teaches
    # to all others (the prior is the common offset; pool-wide shifts have their own, below).
    # log context length, centred on ~200 characters: one unit per factor of e^2 (about 7)
    names = ["kind=" + kind, "p_structured", "temperature", "log_length"]
    values = [1.0, p_structured - 0.5, t, (math.log1p(total) - 5.3) / 2.0]
    rf = body.get("response_format")
    if isinstance(rf, Mapping) and isinstance(rf.get("type"), str):
        names.append("response_format=" + rf["type"][:32])
        values.append(1.0)
    if body.get("tools"):
        names.append("tools")
        values.append(1.0)
    gram_slots: tuple[int, ...] | None = None
    count = 0  # word grams
    if window:
        # str.isascii runs in C: the per-character count is paid only by text that has non-ASCII in it
        non_ascii = 0.0 if window.isascii() else sum(1 for ch in window if ord(ch) > 127) / len(window)
        if non_ascii > 0.1:
            names.append("non_ascii")
            values.append(non_ascii)
        if _WORD_SLOTS is not None and _spaced(window):
            gram_slots = _WORD_SLOTS(window, WINDOW_WORDS, MASK)
        if gram_slots is not None:
            count = len(gram_slots)
        else:
            grams = _grams(window)
            count = len(grams)
        if count:
            values += [1.0 / math.sqrt(count)] * count
    fixed = tuple(names)
    slots = tuple(map(_FIXED.get, names))  # the known names' slots in one pass, then the others'
    if None in slots:
        slots = tuple([slot(n) if s is None else s for s, n in zip(slots, names, strict=True)])
    if gram_slots is None and count:
        gram_slots = tuple([slot("w=" + g) for g in grams])
    if gram_slots:
        slots += gram_slots
    return Features(slots, tuple(values), fixed, window if count else "", kind)  # type: ignore[arg-type]
