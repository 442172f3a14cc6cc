"""Turn an OpenAI completions or chat request body into the texts and fields the classifier reads.

The last user turn decides what the reply will look like, so it is kept apart from the context (system
prompt and earlier turns). Request fields that constrain the output (JSON mode, guided decoding, tools)
and sampling settings are read here too; none of this may raise on malformed input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform

MAX_CHARS = 200_000  # never look beyond this much text of any one field
MAX_ITEMS = 64  # nor beyond this many items of an array (a prompt of token ids, a list of stop strings)
SYSTEM_SCAN = 4_000  # characters of each system message read for a JSON or tool contract
# A system prompt that asks for JSON or lays out functions with typed parameters: the reply is a JSON object
# or a tool call whatever the user's words are. JSON and its schema keywords read the same in every language.
_SYSTEM_JSON = re.compile(r'json|"(?:parameters|properties|arguments)"\s*:', re.IGNORECASE)


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """A value made per prediction and never changed: a slotted dataclass, frozen for the type checker.

    ``mypy --strict`` refuses assignments to its fields as for ``frozen=True``, while ``__init__`` stores
    them directly instead of through ``object.__setattr__`` per field (the view and the prediction of
    every request: 20,000 instructions less). Not hashable.
    """
    return dataclass(slots=True)(cls)


@record
class RequestView:
    text: str  # the text whose reply is predicted: completions prompt or last user turn
    context: str  # system prompt and earlier turns, joined
    turns: int  # number of chat messages (1 for a completions prompt)
    has_system: bool
    constrained: float  # 1 for JSON schema / regex / grammar constraints, 0.5 for json_object / choice
    tools: bool
    system_json: bool  # a system prompt that asks for JSON or defines tools (see _SYSTEM_JSON)
    temperature: float | None
    stop_structured: bool  # stop sequences that end code or lines
    max_tokens: int | None


def _content_text(content: Any) -> str:
    """Message content may be a string or a list of parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content[:MAX_CHARS]
    if isinstance(content, list):
        parts: list[str] = []
        for part in content[:64]:
            if isinstance(part, str):
                parts.append(part[:MAX_CHARS])
            elif isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text[:MAX_CHARS])
        return "\n".join(parts)
    return ""


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt[:MAX_CHARS]
    if isinstance(prompt, list):
        # a batch of prompts (or token ids): the first string stands for the batch; a batch's items
        # share one type, so a few tell (a million token ids are not read one by one)
        for item in prompt[:MAX_ITEMS]:
            if isinstance(item, str):
                return item[:MAX_CHARS]
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


_GUIDED = ("guided_json", "guided_regex", "guided_grammar")
_CONSTRAINT_KEYS = frozenset((*_GUIDED, "guided_choice", "structured_outputs", "response_format"))
#: vLLM's ``structured_outputs`` members, weighed as the ``guided_*`` field each one replaces
_STRUCTURED_OUTPUTS = (
    ("json", 1.0),
    ("regex", 1.0),
    ("grammar", 1.0),
    ("json_object", 0.75),
    ("choice", 0.5),
)


def _constraint(body: Mapping[str, Any]) -> float:
    if _CONSTRAINT_KEYS.isdisjoint(body):  # most requests: one C-level pass over the body's few keys
        return 0.0
    for key in _GUIDED:
        if body.get(key):
            return 1.0
    so = body.get("structured_outputs")
    if isinstance(so, Mapping):
        # vLLM maps the ``guided_*`` fields onto this one: the same constraint weighs the same either way
        for key, weight in _STRUCTURED_OUTPUTS:
            if so.get(key):
                return weight
    if body.get("guided_choice"):
        return 0.5
    rf = body.get("response_format")
    if isinstance(rf, Mapping):
        kind = rf.get("type")
        if kind == "json_schema":
            return 1.0
        if kind == "json_object":
            return 0.75
    return 0.0


def _stop_structured(stop: Any) -> bool:
    if not stop:
        return False
    stops = [stop] if isinstance(stop, str) else stop[:MAX_ITEMS] if isinstance(stop, list) else []
    return any(
        isinstance(s, str) and ("```" in s or "\n" in s or s.strip() in {";", "}", "</"}) for s in stops
    )


def _tail(sep: str, parts: list[str], limit: int) -> str:
    """``sep.join(parts)[-limit:]``, joining only the parts that reach into it (a long chat's history
    is megabytes; the classifier reads a few hundred characters of it)."""
    size, start = -len(sep), len(parts)  # the length of ``sep.join(parts[start:])``
    while start > 0 and size < limit:
        start -= 1
        size += len(parts[start]) + len(sep)
    return sep.join(parts[start:])[-limit:]


def view(body: Mapping[str, Any]) -> RequestView:
    """Read a request body; unknown shapes give an empty view rather than an error."""
    text, context, turns, has_system, system_json = "", "", 1, False, False
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        msgs = [m for m in messages[-200:] if isinstance(m, Mapping)]
        turns = len(msgs)
        last_user = -1
        for i in range(len(msgs) - 1, -1, -1):
            if msgs[i].get("role") == "user":
                last_user = i
                break
        if last_user < 0 and msgs:
            last_user = len(msgs) - 1
        earlier: list[str] = []
        for i, m in enumerate(msgs):
            content = _content_text(m.get("content"))
            if i == last_user:
                text = content
            elif content:
                if m.get("role") in ("system", "developer"):
                    has_system = True
                    system_json = system_json or _SYSTEM_JSON.search(content, 0, SYSTEM_SCAN) is not None
                earlier.append(content)
        context = _tail("\n", earlier, MAX_CHARS)
    else:
        text = _prompt_text(body.get("prompt"))
    tools = body.get("tools") or body.get("functions")
    tool_choice = body.get("tool_choice")
    # vLLM's chat reads ``max_completion_tokens or max_tokens`` (completions have only the second)
    max_tokens = _number(body.get("max_completion_tokens") or body.get("max_tokens"))
    return RequestView(
        text=text,
        context=context,
        turns=turns,
        has_system=has_system,
        constrained=_constraint(body),
        tools=bool(tools) and isinstance(tools, list) and tool_choice != "none",
        system_json=system_json,
        temperature=_number(body.get("temperature")),
        stop_structured=_stop_structured(body.get("stop")),
        max_tokens=int(max_tokens) if max_tokens is not None else None,
    )
