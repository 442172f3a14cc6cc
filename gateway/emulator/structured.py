"""Structured output: the JSON value (or choice) a guided-decoding request constrains the answer to.

vLLM constrains generation to a JSON schema (``response_format`` ``json_schema``, the Responses API's
``text.format``, ``structured_outputs.json``, the older ``guided_json``), to any JSON object
(``json_object``) or to one of a list of strings (``structured_outputs.choice``, ``guided_choice``).
The emulator does not sample under a grammar; it builds one value that satisfies the schema (types,
required and optional properties, enums and constants, array bounds, ``$ref``, ``anyOf``) from the
request's seeded RNG and streams its text with the usual timing. Clients that parse the answer into a
typed object (``client.beta.chat.completions.parse`` with a pydantic model) get one that validates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.emulator.textgen import WORDS
from gateway.emulator.tokenizer import pieces


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraint:
    """What the answer must be: a JSON value valid against ``schema`` (``{}``: any object), or a choice."""

    schema: dict[str, Any] | None = None
    choices: tuple[str, ...] = ()
    param: str = "response_format"  # the request field that asked for it

    def render(self, rng: random.Random) -> str:
        """The whole answer text; a schema it cannot satisfy raises :class:`ConstraintError`."""
        if self.choices:
            return self.choices[rng.randrange(len(self.choices))]
        schema = self.schema or {}
        try:
            value = _value(schema if schema else {"type": "object"}, schema, rng, 0, _Budget())
            return orjson.dumps(value).decode()
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError):
            message = f"{self.param} is not a JSON schema the emulator can satisfy"
            raise ConstraintError(message, self.param) from None

    def check(self) -> None:
        """Raise :class:`ConstraintError` now, at validation, for a schema :meth:`render` would fail on."""
        self.render(random.Random(0))


class ConstraintError(ValueError):
    """A constraint the request spells wrong; the message names what is wrong, ``param`` the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def from_request(d: dict[str, Any]) -> Constraint | None:
    """The constraint a chat, completion or Responses request asks for, if any."""
    rf = d.get("response_format")
    if isinstance(rf, dict):
        found = _format(rf, "response_format", nested=True)
        if found is not None:
            return found
    text = d.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        found = _format(text["format"], "text", nested=False)
        if found is not None:
            return found
    so = d.get("structured_outputs")
    if isinstance(so, dict):
        param = "structured_outputs"
        if so.get("json") is not None:
            return Constraint(schema=_schema(so["json"], param), param=param)
        if so.get("choice") is not None:
            return Constraint(choices=_choices(so["choice"], param), param=param)
        if so.get("json_object"):
            return Constraint(schema={}, param=param)
    if d.get("guided_json") is not None:
        return Constraint(schema=_schema(d["guided_json"], "guided_json"), param="guided_json")
    if d.get("guided_choice") is not None:
        return Constraint(choices=_choices(d["guided_choice"], "guided_choice"), param="guided_choice")
    return None


def _format(fmt: dict[str, Any], param: str, *, nested: bool) -> Constraint | None:
    """A format object; ``response_format`` nests the schema under ``json_schema``, ``text.format`` not."""
    kind = fmt.get("type")
    if kind == "json_object":
        return Constraint(schema={}, param=param)
    if kind == "json_schema":
        holder = fmt.get("json_schema") if nested else fmt
        if not isinstance(holder, dict):
            raise ConstraintError(f"{param}.json_schema must be an object", param)
        schema = holder.get("schema", holder.get("json_schema"))
        return Constraint(schema=_schema(schema if schema is not None else {}, param), param=param)
    if kind in (None, "text", "structural_tag"):
        return None
    raise ConstraintError(f"{param}.type must be one of text, json_object, json_schema; got {kind!r}", param)


def _schema(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise ConstraintError(f"{param} is not a valid JSON schema", param) from None
    if not isinstance(value, dict):
        raise ConstraintError(f"{param} must be a JSON schema object", param)
    return value


def _choices(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ConstraintError(f"{param} must be a non-empty list of strings", param)
    return tuple(value)


_MAX_DEPTH = 8
_MAX_ITEMS = 64  # an array's length, whatever minItems asks
_MAX_CHARS = 4096  # a string's length, whatever minLength asks
_MAX_VALUES = 4096  # values in one answer, however its arrays nest
_MAX_TOTAL_CHARS = 1 << 16  # characters of strings in one answer


@dataclass(slots=True)
class _Budget:
    """What one answer may still hold.

    Each array is bounded, but arrays nest: an array of ten arrays of ten (a ``$ref`` to the schema
    itself is enough) asks for ten to the power of the depth, which no memory holds. Past the budget a
    value is cut short (arrays end, strings stay empty, values become null), as vLLM cuts a guided answer
    at ``max_tokens``; no answer the emulator streams is longer than that anyway.
    """

    values: int = _MAX_VALUES
    chars: int = _MAX_TOTAL_CHARS


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow local ``$ref`` pointers (``#/$defs/Name``, ``#/definitions/Name``)."""
    seen = 0
    while isinstance(schema.get("$ref"), str) and seen < 32:
        node: Any = root
        for part in schema["$ref"].lstrip("#").strip("/").split("/"):
            if not part:
                continue
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return {}
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**node, **extra}
        seen += 1
    return schema


def _value(
    schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int, budget: _Budget
) -> Any:
    """One JSON value valid against ``schema`` (within ``budget``)."""
    budget.values -= 1  # a null in its place counts too
    if depth > 4 * _MAX_DEPTH or budget.values < 0:  # a schema that requires itself, or too much: cut off
        return None
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][rng.randrange(len(schema["enum"]))]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            # a nullable field (``X | None``) gets its value, not null
            typed = [o for o in options if isinstance(o, dict) and o.get("type") != "null"] or options
            return _value(typed[0], root, rng, depth, budget)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged.update(_resolve(part, root))
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return _value({**merged, **rest}, root, rng, depth, budget)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else ("array" if "items" in schema else "string")
    if kind == "object":
        return _object(schema, root, rng, depth, budget)
    if kind == "array":
        return _array(schema, root, rng, depth, budget)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        lo = float(schema.get("minimum", schema.get("exclusiveMinimum", 0)))
        hi = float(schema.get("maximum", schema.get("exclusiveMaximum", lo + 100)))
        return round(lo + (hi - lo) * (0.25 + rng.random() / 2), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng, budget)


def _object(
    schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int, budget: _Budget
) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        if schema.get("additionalProperties") is False or depth >= _MAX_DEPTH:
            return {}
        return {"answer": " ".join(WORDS[rng.randrange(len(WORDS))] for _ in range(3))}
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set(props)
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in needed or depth < 2:  # optional properties too, near the top
            out[name] = _value(sub if isinstance(sub, dict) else {}, root, rng, depth + 1, budget)
    return out


def _array(
    schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int, budget: _Budget
) -> list[Any]:
    lo = min(int(schema.get("minItems", 1 if depth < _MAX_DEPTH else 0)), _MAX_ITEMS)
    hi = min(int(schema.get("maxItems", max(lo, 3))), _MAX_ITEMS)
    count = min(max(lo, min(hi, 2 + rng.randrange(2))), hi) if depth < _MAX_DEPTH else lo
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and prefix:
        return [_value(p, root, rng, depth + 1, budget) for p in prefix if isinstance(p, dict)]
    items: dict[str, Any] = schema["items"] if isinstance(schema.get("items"), dict) else {}
    values = []
    for _ in range(count):
        if budget.values <= 0:  # cut short: the rest would be nulls
            break
        values.append(_value(items, root, rng, depth + 1, budget))
    if schema.get("uniqueItems") and len({orjson.dumps(v) for v in values}) < len(values):
        values = values[:1]
    return values


def _integer(schema: dict[str, Any], rng: random.Random) -> int:
    lo = schema.get("minimum")
    if lo is None and schema.get("exclusiveMinimum") is not None:
        lo = int(schema["exclusiveMinimum"]) + 1
    hi = schema.get("maximum")
    if hi is None and schema.get("exclusiveMaximum") is not None:
        hi = int(schema["exclusiveMaximum"]) - 1
    low = int(lo) if lo is not None else 0
    high = int(hi) if hi is not None else low + 100
    return rng.randint(low, max(low, high))


def _string(schema: dict[str, Any], rng: random.Random, budget: _Budget) -> str:
    fmt = schema.get("format")
    if fmt == "date":
        return f"2024-{1 + rng.randrange(12):02d}-{1 + rng.randrange(28):02d}"
    if fmt == "date-time":
        return f"2024-{1 + rng.randrange(12):02d}-{1 + rng.randrange(28):02d}T12:00:00Z"
    if fmt == "email":
        return f"{WORDS[rng.randrange(len(WORDS))].lower()}@example.com"
    if fmt in ("uri", "url"):
        return f"https://example.com/{WORDS[rng.randrange(len(WORDS))].lower()}"
    if fmt == "uuid":
        return "-".join(f"{rng.getrandbits(b * 4):0{b}x}" for b in (8, 4, 4, 4, 12))
    room = max(0, min(_MAX_CHARS, budget.chars))
    lo = min(int(schema.get("minLength", 1)), room)
    hi = min(int(schema.get("maxLength", max(lo, 40))), room)
    words: list[str] = []
    text = ""
    while len(text) < lo or (len(words) < 2 + rng.randrange(3) and len(text) < hi):
        words.append(WORDS[rng.randrange(len(WORDS))])
        text = " ".join(words)
    if len(text) > hi:
        text = text[:hi].rstrip() or text[:hi]
    while len(text) < lo:
        text += "x"
    budget.chars -= len(text)
    return text


class FixedSource:
    """The tokens of one fixed answer, then nothing: the sequence stops there (finish reason ``stop``)."""

    __slots__ = ("_pieces",)

    def __init__(self, text: str) -> None:
        self._pieces = pieces(text)

    def take(self, n: int) -> list[str]:
        out = self._pieces[:n]
        del self._pieces[:n]
        return out
