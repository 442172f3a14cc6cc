"""Pseudo-tokenizer of the emulator: about 4 characters per token, stable token ids.

A piece is a run of at most 4 letters (with its leading space), a run of at most 3 digits (with its
leading space), one other symbol (with its leading space) or one whitespace character. Every character
of the input lands in exactly one piece, so ``"".join(pieces(text)) == text``. The id of a piece is a
CRC-32 hash folded into ``[FIRST_ID, VOCAB_SIZE)``: the same piece always has the same id, in every
process. Chat prompts are rendered with a ChatML template whose markers count as one token each.
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

VOCAB_SIZE = 32000
BOS_ID = 1
EOS_ID = 2
IM_START_ID = 3
IM_END_ID = 4
NEWLINE_ID = 5
FIRST_ID = 300

_PIECE_RE = re.compile(r" ?[^\W\d_]{1,4}| ?\d{1,3}| ?[^\w\s]|\s|_")
_ROLE_IDS = {"system": 10, "user": 11, "assistant": 12, "tool": 13, "developer": 14}


def pieces(text: str) -> list[str]:
    return _PIECE_RE.findall(text)


#: the text of every id this process has made, for :func:`decode` (at most one entry per id)
_TEXT: dict[int, str] = {}
_SPECIAL = {BOS_ID: "", EOS_ID: "", IM_START_ID: "<|im_start|>", IM_END_ID: "<|im_end|>", NEWLINE_ID: "\n"}
_ROLE_TEXT = {10: "system", 11: "user", 12: "assistant", 13: "tool", 14: "developer", 15: "user"}


@lru_cache(maxsize=65536)
def piece_id(piece: str) -> int:
    tid = FIRST_ID + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % (VOCAB_SIZE - FIRST_ID)
    _TEXT.setdefault(tid, piece)
    return tid


def decode(ids: list[int] | tuple[int, ...]) -> str:
    """The text of ``ids`` (BOS and EOS left out, like ``skip_special_tokens``).

    Ids are hashes of their pieces, so only ids this process has handed out (by tokenising or
    generating) have a text; an id two pieces share decodes to the first one seen. Text tokenised
    here decodes back to itself.
    """
    out = []
    for tid in ids:
        text = _SPECIAL.get(tid) if tid < FIRST_ID else _TEXT.get(tid)
        if text is None and tid < FIRST_ID:
            text = _ROLE_TEXT.get(tid, "")
        out.append(text or "")
    return "".join(out)


def known(tid: int) -> bool:
    """Whether :func:`decode` has a text for ``tid``."""
    return tid < FIRST_ID or tid in _TEXT


@lru_cache(maxsize=4096)
def encode(text: str) -> tuple[int, ...]:
    """Token ids of ``text`` (no special tokens)."""
    return tuple(piece_id(p) for p in _PIECE_RE.findall(text))


def encode_prompt(text: str) -> tuple[int, ...]:
    """Completion prompt ids: BOS then the text's tokens (like a Llama/Qwen tokenizer with BOS)."""
    return (BOS_ID, *encode(text))


def render_chat(messages: list[tuple[str, str]], continue_final: bool = False) -> str:
    """The ChatML text of ``(role, content)`` pairs plus the assistant generation prompt.

    With ``continue_final`` the last message is left open (no end marker, no generation prompt), as
    vLLM's ``continue_final_message`` renders it, so the model goes on writing that message.
    """
    parts = [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages]
    if continue_final and parts:
        parts[-1] = parts[-1][: -len("<|im_end|>\n")]
    else:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


@lru_cache(maxsize=4096)
def _encode_chat_cached(messages: tuple[tuple[str, str], ...], continue_final: bool) -> tuple[int, ...]:
    ids: list[int] = []
    for role, content in messages:
        ids.append(IM_START_ID)
        ids.append(_ROLE_IDS.get(role, 15))
        ids.append(NEWLINE_ID)
        ids.extend(encode(content))
        ids.append(IM_END_ID)
        ids.append(NEWLINE_ID)
    if continue_final and messages:
        del ids[-2:]
    else:
        ids.extend((IM_START_ID, _ROLE_IDS["assistant"], NEWLINE_ID))
    return tuple(ids)


def encode_chat(messages: list[tuple[str, str]], continue_final: bool = False) -> tuple[int, ...]:
    """Chat prompt ids: each message is ``<im_start> role \\n content <im_end> \\n``, then the
    generation prompt ``<im_start> assistant \\n`` (or, with ``continue_final``, the last message
    left open)."""
    return _encode_chat_cached(tuple(messages), continue_final)
