"""Deterministic generated text: what the emulated model "says".

The output depends only on the prompt, the prompt's category (see :mod:`acceptance`) and the request's
text RNG, never on the mode (speculative or baseline) or on batching: a speculative pool and a
baseline pool give the same text for the same greedy request, as real speculative decoding does.
Text is produced in segments and cut into tokens with the pseudo-tokenizer.

Like a real model at temperature 0, the emulator's output is a function of the context: a context
that is a prompt followed by the start of what the emulator itself says to that prompt continues
with the rest of that answer (:meth:`TextSource.skip`, :func:`split_points`). That is what lets a
client, or the gateway, resume a broken stream elsewhere and get the same text as an unbroken run.
"""

from __future__ import annotations

import random
import re

from gateway.emulator.tokenizer import pieces

_WORDS_TEXT = (
    "the of and to in is that it for as with was on be by this are from at or an have not but they "
    "which one you all were their we there been has more when will would who so if out up about into "
    "than them can only other time new some could these two may first then do any like my now over "
    "such our man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three light "
    "model river quiet garden memory window morning silver stone voice ocean forest music answer "
    "meaning reason simple careful gentle distant ancient bright history journey question promise"
)
WORDS = tuple(_WORDS_TEXT.split())

_KEYS_TEXT = (
    "id name type value status count price label enabled version owner region created updated "
    "timeout retries host port path mode level limit"
)
_KEYS = tuple(_KEYS_TEXT.split())
_IDENTS = (
    "data",
    "items",
    "result",
    "value",
    "total",
    "index",
    "count",
    "buffer",
    "node",
    "key",
    "row",
    "acc",
)
_QUOTED_RE = re.compile("[\"'\u201c\u2018]([^\"'\u201d\u2019\n]{2,200})[\"'\u201d\u2019]")
_NUM_RE = re.compile(r"-?\d+")


class TextSource:
    """An endless, deterministic stream of output tokens (text pieces)."""

    __slots__ = ("_buf", "_category", "_num", "_prompt_words", "_repeat", "_rng", "_state", "_step")

    def __init__(self, prompt: str, category: str, rng: random.Random) -> None:
        self._rng = rng
        self._category = category
        self._buf: list[str] = []
        self._state = 0
        self._repeat = ""
        self._num = 1
        self._step = 1
        self._prompt_words: list[str] = []
        if category == "repetition":
            self._repeat = _repeat_target(prompt)
        elif category == "numeric":
            nums = [int(n) for n in _NUM_RE.findall(prompt)[-8:] if len(n.lstrip("-")) <= 9]
            if len(nums) >= 2 and nums[-1] != nums[-2]:
                self._step = nums[-1] - nums[-2]
                self._num = nums[-1] + self._step
            elif nums:
                self._num = nums[-1] + 1
        elif category in ("extraction", "self-repetition"):
            self._prompt_words = [w for w in prompt.split() if not w.startswith("<|")] or list(WORDS[:20])

    def take(self, n: int) -> list[str]:
        """The next ``n`` tokens."""
        buf = self._buf
        while len(buf) < n:
            buf.extend(pieces(self._segment()))
        out = buf[:n]
        del buf[:n]
        return out

    def skip(self, said: str) -> bool:
        """Consume the tokens that spell ``said``; False when this source would not have said it.

        ``said`` must end on a token boundary: a context cut inside a token does not continue.
        """
        got = ""
        while len(got) < len(said):
            got += self.take(1)[0]
            if not said.startswith(got):
                return False
        return got == said

    def _segment(self) -> str:
        rng = self._rng
        cat = self._category
        self._state += 1
        if cat == "repetition":
            return self._repeat + "\n"
        if cat == "numeric":
            n = self._num
            self._num += self._step
            return f"{n}, "
        if cat == "structured-data":
            key = _KEYS[rng.randrange(len(_KEYS))]
            r = rng.random()
            if r < 0.4:
                value = str(rng.randrange(1000))
            elif r < 0.5:
                value = "true"
            else:
                value = f'"{WORDS[rng.randrange(len(WORDS))]}"'
            return f'  "{key}": {value},\n'
        if cat == "code":
            a = _IDENTS[rng.randrange(len(_IDENTS))]
            b = _IDENTS[rng.randrange(len(_IDENTS))]
            n = rng.randrange(1, 100)
            templates = (
                f"def compute_{a}({b}):\n",
                f"    {a} = {b} + {n}\n",
                f"    for i in range({n}):\n",
                f"        {a}[i] = {b}[i] * {n}\n",
                f"    return {a}\n",
                "\n",
            )
            return templates[self._state % len(templates)]
        if cat in ("extraction", "self-repetition"):
            words = self._prompt_words
            start = rng.randrange(len(words))
            span = words[start : start + rng.randint(3, 8)]
            return "- " + " ".join(span) + "\n"
        # prose
        n = rng.randint(6, 16)
        words = [WORDS[rng.randrange(len(WORDS))] for _ in range(n)]
        return " " + " ".join(words).capitalize() + "."


def split_points(text: str, window: int) -> list[tuple[int, str, str]]:
    """Ways to read ``text`` as (its tokens in the prompt, prompt, start of the answer to it): cuts
    at its last ``window`` token boundaries, earliest first, each leaving both parts non-empty."""
    toks = pieces(text)
    out = []
    cut = len(text)
    for j in range(len(toks) - 1, max(0, len(toks) - 1 - window), -1):
        cut -= len(toks[j])
        out.append((j, text[:cut], text[cut:]))
    out.reverse()
    return out


def opening_categories(prompt: str, said: str) -> list[str]:
    """The categories whose answer to ``prompt`` can begin with ``said``, from the shape of each
    one's first segment (prose: a space and a capitalised word; code and structured data: an
    indented line; lists: a dash; repetition: a line taken from the prompt)."""
    first, second = said[:1], said[1:2]
    if first == "-":
        out = ["extraction", "self-repetition", "numeric"]
    elif first.isdigit():
        out = ["numeric"]
    elif first == " " and not second:
        out = ["prose", "structured-data", "code"]
    elif first == " " and second == " ":
        out = ["structured-data", "code"]
    elif first == " " and second.isupper():
        out = ["prose"]
    else:
        out = []
    if said.split("\n", 1)[0] in prompt:
        out.append("repetition")
    return out


def _repeat_target(prompt: str) -> str:
    quoted = _QUOTED_RE.findall(prompt)
    if quoted:
        return str(quoted[-1]).strip()
    text = prompt.replace("<|im_end|>", "\n").replace("<|im_start|>", "\n")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() not in ("user", "assistant")]
    if not lines:
        return "All work and no play makes Jack a dull boy."
    last = lines[-1]
    if ":" in last and last.rsplit(":", 1)[1].strip():
        return last.rsplit(":", 1)[1].strip()
    if len(lines) >= 2:
        return lines[-1]
    return last
