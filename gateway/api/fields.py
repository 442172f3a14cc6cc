"""The JSON type of every request field the OpenAI and vLLM APIs define, checked before routing.

The gateway reads some of these fields itself (``model``, ``stream``, ``stream_options``, ``n``, the
prompt) and the classifier reads more; a field of the wrong type would otherwise reach code that
assumes its type, or go upstream only to come back as a 400 after a routing decision was counted.
Only the type is checked here: values (a negative ``max_tokens``, an unknown role) are the upstream's
to judge, and its 4xx reaches the client unchanged. Fields not listed pass through untouched: vLLM
accepts many extras. ``null`` is accepted for every optional field, as the OpenAI API does.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.api.errors import APIError
from gateway.routing.policy import Api

#: the Python type each JSON type parses to (orjson and the standard library give exactly these; ``bool``
#: is not an integer here)
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}

_COMMON: dict[str, tuple[str, ...]] = {
    "model": ("string",),
    "stream": ("boolean",),
    "stream_options": ("object",),
    "max_tokens": ("integer",),
    "min_tokens": ("integer",),
    "n": ("integer",),
    "best_of": ("integer",),
    "temperature": ("number",),
    "top_p": ("number",),
    "top_k": ("integer",),
    "min_p": ("number",),
    "presence_penalty": ("number",),
    "frequency_penalty": ("number",),
    "repetition_penalty": ("number",),
    "length_penalty": ("number",),
    "seed": ("integer",),
    "stop": ("string", "array"),
    "stop_token_ids": ("array",),
    "user": ("string",),
    "ignore_eos": ("boolean",),
    "logit_bias": ("object",),
    "response_format": ("object",),
    "top_logprobs": ("integer",),
    "skip_special_tokens": ("boolean",),
    "spaces_between_special_tokens": ("boolean",),
    "include_stop_str_in_output": ("boolean",),
    "guided_json": ("string", "object"),
    "guided_regex": ("string",),
    "guided_choice": ("array",),
    "guided_grammar": ("string",),
    "structured_outputs": ("object",),
    "priority": ("integer",),
    "request_id": ("string",),
}

FIELDS: dict[Api, dict[str, tuple[str, ...]]] = {
    "chat": {
        **_COMMON,
        "messages": ("array",),
        "max_completion_tokens": ("integer",),
        "logprobs": ("boolean",),
        "tools": ("array",),
        "tool_choice": ("string", "object"),
        "parallel_tool_calls": ("boolean",),
        "functions": ("array",),
        "function_call": ("string", "object"),
        "chat_template": ("string",),
        "chat_template_kwargs": ("object",),
        "add_generation_prompt": ("boolean",),
        "continue_final_message": ("boolean",),
    },
    "completions": {
        **_COMMON,
        "prompt": ("string", "array"),
        "logprobs": ("integer",),
        "echo": ("boolean",),
        "suffix": ("string",),
    },
}

_STREAM_OPTIONS: dict[str, tuple[str, ...]] = {
    "include_usage": ("boolean",),
    "continuous_usage_stats": ("boolean",),
}


def _allowed(table: dict[str, tuple[str, ...]]) -> dict[str, frozenset[type]]:
    return {name: frozenset(t for kind in kinds for t in _PY_TYPES[kind]) for name, kinds in table.items()}


# Checked by exact type against the body's own fields (a few), not by walking every known field (~45):
# a couple of microseconds per request instead of ten.
_ALLOWED = {api: _allowed(table) for api, table in FIELDS.items()}
_ALLOWED_STREAM_OPTIONS = _allowed(_STREAM_OPTIONS)
_NONE = type(None)


def _wrong_type(param: str, types: tuple[str, ...], value: Any) -> APIError:
    if "integer" in types and isinstance(value, float) and value.is_integer():
        # JSON has one number type: an integer beyond 64 bits parsed as a float (orjson's reading), but
        # the client sent an integer, too large for any field (vLLM's bounds are 64-bit)
        return _out_of_range(param)
    expected = " or ".join(f"a{'n' if t[0] in 'aeiou' else ''} {t}" for t in types)
    return APIError(400, f"'{param}' must be {expected}", param=param)


def _out_of_range(param: str) -> APIError:
    return APIError(400, f"'{param}' is out of range: at most a 64-bit integer", param=param)


#: the integers orjson reads as integers; the bounds of every integer field the gateway passes on
MIN_INT, MAX_INT = -(2**63), 2**64 - 1


def whole(value: Any) -> int | None:
    """The integer a JSON number written as a decimal stands for (``100.0``, ``1e2``), as vLLM reads it;
    None for a fraction, or past 2**53, where a float no longer tells integers apart (an integer literal
    past 64 bits also parses as a float, and rounds to one that looks whole)."""
    if type(value) is float and value.is_integer() and -(2**53) <= value <= 2**53:
        return int(value)
    return None


SCALARS = frozenset((str, int, float, bool))

#: how vLLM's request models (pydantic, lax mode) read a scalar field sent as another scalar: "0.5", "8",
#: "false" are a number, an integer and a boolean there, 1 and 0 a boolean, true a number
_LAX: dict[tuple[str, ...], TypeAdapter[Any]] = {
    ("integer",): TypeAdapter(int),
    ("number",): TypeAdapter(float),
    ("boolean",): TypeAdapter(bool),
}


def lax(value: Any, types: tuple[str, ...]) -> Any:
    """The value vLLM reads from a scalar field sent as another scalar ("0.5", "false", 1 for a boolean,
    true for a number), or None where it refuses it."""
    adapter = _LAX.get(types)
    if adapter is None:
        return None
    try:
        read = adapter.validate_python(value)
    except ValidationError:
        return None
    return read if type(read) is not int or MIN_INT <= read <= MAX_INT else None


def _check_fields(
    obj: dict[str, Any],
    allowed: dict[str, frozenset[type]],
    table: dict[str, tuple[str, ...]],
    prefix: str = "",
) -> None:
    read_as = None
    for name, value in obj.items():
        types = allowed.get(name)
        if types is not None and type(value) not in types and type(value) is not _NONE:
            if "integer" in table[name] and (n := whole(value)) is not None:
                read_as = {**(read_as or {}), name: n}
                continue
            if type(value) in SCALARS and (v := lax(value, table[name])) is not None:
                read_as = {**(read_as or {}), name: v}
                continue
            raise _wrong_type(prefix + name, table[name], value)
    if read_as:
        # read as vLLM reads them from here on (the body forwarded as sent says the same to vLLM)
        obj.update(read_as)


def _check(value: Any, param: str, types: tuple[str, ...]) -> None:
    if value is not None and not any(type(value) in _PY_TYPES[t] for t in types):
        raise _wrong_type(param, types, value)


def check_types(payload: dict[str, Any], api: Api) -> None:
    """Raise a 400 naming the first field whose JSON type the API does not allow.

    An integer field written as a whole decimal (``"max_tokens": 100.0``) is the integer, as vLLM's
    request models read it, and is replaced by it in ``payload``; a fraction is refused. So is a number,
    integer or boolean written as another scalar that vLLM's models read (``"temperature": "0.5"``,
    ``"stream": "false"``, ``"stream": 1``): the gateway routes on what vLLM will do.
    """
    _check_fields(payload, _ALLOWED[api], FIELDS[api])
    opts = payload.get("stream_options")
    if isinstance(opts, dict):
        _check_fields(opts, _ALLOWED_STREAM_OPTIONS, _STREAM_OPTIONS, "stream_options.")
    if api == "chat":
        _check_messages(payload.get("messages"))
    elif payload.get("prompt") is not None or payload.get("prompt_embeds") is None:
        _check_prompt(payload.get("prompt"))  # a prompt given as embeddings alone is vLLM's to read


def check_ranges(payload: dict[str, Any], api: Api) -> None:
    """Raise a 400 naming the first integer field whose value is past 64 bits.

    For a body parsed exactly (one that may hold such integers, :func:`gateway.api.request.json_object`),
    after :func:`check_types`: an integer field past 64 bits gets the 400 it gets when orjson reads it
    as a float, and an integer anywhere else (a schema's ``const``, ``vllm_xargs``) goes on exact.
    Off the common path: the parse finds such bodies.
    """
    table = FIELDS[api]  # (``stream_options`` has no integer field)
    for name, value in payload.items():
        types = table.get(name)
        if types and "integer" in types and type(value) is int and not MIN_INT <= value <= MAX_INT:
            raise _out_of_range(name)


_CONTENT = frozenset((str, list, _NONE))


def _check_messages(messages: Any) -> None:
    if type(messages) is not list or not messages:
        raise APIError(400, "'messages' must be a non-empty array of messages", param="messages")
    for m in messages:
        if type(m) is not dict or type(m.get("role")) is not str or type(m.get("content")) not in _CONTENT:
            _raise_for_messages(messages)


def _raise_for_messages(messages: list[Any]) -> None:
    """The error for the first message at fault (kept off the common path: it builds names)."""
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(400, f"'{param}' must be an object", param=param)
        if m.get("role") is None:
            raise APIError(400, f"'{param}.role' is a required property", param=f"{param}.role")
        _check(m.get("role"), f"{param}.role", ("string",))
        _check(m.get("content"), f"{param}.content", ("string", "array"))


#: how many items of a prompt's arrays are checked: a prompt of token ids may hold a million (a 4 MB
#: body), and checking each cost 100 ms of the event loop; the upstream checks the rest itself
CHECKED_ITEMS = 256


def _check_prompt(prompt: Any) -> None:
    """A string, or a non-empty array of strings, of token ids, or of arrays of token ids (as far as
    their first :data:`CHECKED_ITEMS` items show)."""
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        head = prompt[:CHECKED_ITEMS]
        if all(isinstance(p, str) for p in head) or all(_token_ids(p) for p in head):
            return
        if _token_ids(prompt):
            return
    raise APIError(
        400,
        "'prompt' must be a string, an array of strings, an array of token ids "
        "or an array of arrays of token ids",
        param="prompt",
    )


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value[:CHECKED_ITEMS])
    )
