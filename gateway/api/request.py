"""Validating an incoming OpenAI request: auth, size, time to arrive, JSON, the type of every field.

The gateway checks the JSON type of each field the API defines (see :mod:`gateway.api.fields`) and
the model name; values and unknown fields pass through untouched and the upstream validates them
(its 4xx bodies reach the client unchanged).
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import os
import re
import zlib
from typing import Any

import orjson
from starlette.requests import Request

from gateway.api.errors import APIError
from gateway.api.fields import check_ranges, check_types
from gateway.types import (
    CLIENT_SCOPE_KEY,
    CONTENT_CODINGS,
    POOL_NAMES,
    Api,
    ClientState,
    PoolName,
    window_bits,
)

REQUIRED: dict[Api, str] = {"completions": "prompt", "chat": "messages"}


def header(request: Request, name: bytes) -> str | None:
    """The request header ``name`` (lower case), as ``request.headers.get`` reads it: the first value.

    Read straight from the ASGI scope: Starlette's ``Headers`` is built once per request and raises
    and catches a ``KeyError`` for each header that is absent, as most looked up here are.
    """
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


class _RequestIds:
    """Random request ids, 16 hex digits as ``os.urandom(8).hex()`` gives, 512 from each system call.

    A forked process starts with none drawn, so two workers never hand out the same ids.
    """

    __slots__ = ("_at", "_drawn")

    def __init__(self) -> None:
        self._drawn = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._drawn = b""
        self._at = 0

    def next(self) -> str:
        at = self._at
        if at >= len(self._drawn):
            self._drawn, at = os.urandom(4096), 0
        self._at = at + 8
        return self._drawn[at : at + 8].hex()


new_request_id = _RequestIds().next


MAX_REQUEST_ID = 128
"""The longest client ``x-request-id`` kept (a UUID is 36 characters, a W3C trace id 32)."""
REQUEST_ID_KEY = "specroute.request_id"  # the scope's key of the id, once it is known


def request_id(request: Request) -> str:
    """The client's ``x-request-id`` when it is a plausible id, else a new random one.

    The id goes back in the response, upstream to vLLM and into every access-log line, so a client's
    is kept only when it is printable ASCII of at most :data:`MAX_REQUEST_ID` characters: a control
    character, a byte outside ASCII or 20 KB of id would otherwise travel everywhere the id does.
    """
    scope = request.scope
    known: str | None = scope.get(REQUEST_ID_KEY)
    if known is not None:  # once per request: its handler, an error handler, a shutdown's cut agree
        return known
    value = header(request, b"x-request-id")
    rid = value if value is not None and plausible_id(value) else new_request_id()
    scope[REQUEST_ID_KEY] = rid
    return rid


def plausible_id(value: str) -> bool:
    """Whether a client's request id is kept: printable ASCII of at most :data:`MAX_REQUEST_ID` characters."""
    return 0 < len(value) <= MAX_REQUEST_ID and value.isascii() and value.isprintable()


def body_request_id(request: Request, payload: dict[str, Any]) -> str | None:
    """The body's ``request_id`` (a vLLM extension), adopted as the request's id when the client sent no
    ``x-request-id`` it keeps.

    vLLM names a request by its ``X-Request-Id`` header, else by the body's ``request_id``; the gateway
    sends its id upstream in that header, so without this a body's id would never name the request (its
    response ``id``, vLLM's log lines) as it does without the gateway. None when the id stays as it was.
    """
    value = payload.get("request_id")
    if not isinstance(value, str) or not plausible_id(value):
        return None
    sent = header(request, b"x-request-id")
    if sent is not None and plausible_id(sent):
        return None
    request.scope[REQUEST_ID_KEY] = value
    return value


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def trace_id(request: Request) -> str | None:
    """The trace id of the caller's W3C ``traceparent``, for the access log; None without a valid one."""
    value = header(request, b"traceparent")
    if value is None:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None or match[1] == "ff" or match[2] == "0" * 32:  # version ff and zeros are invalid
        return None
    return match[2]


def check_key(request: Request, keys: list[str], what: str = "API key") -> None:
    """Raise a 401 unless the request's bearer token is one of ``keys`` (none: no check)."""
    if not keys:
        return
    auth = header(request, b"authorization") or ""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, f"missing {what}: send 'Authorization: Bearer <key>'", headers=_CHALLENGE)
    token_b = token.strip().encode()
    if not any(hmac.compare_digest(token_b, k.encode()) for k in keys):
        raise APIError(401, f"invalid {what}", headers=_CHALLENGE)


_CHALLENGE = {"www-authenticate": "Bearer"}


def check_operator(request: Request, api_keys: list[str], admin_key: str | None) -> None:
    """Raise a 401 unless the request may use the operator's routes (``/admin/*``, vLLM's adapter routes):
    ``admin_key`` when one is set, else (with ``api_keys`` set) any API key; with neither, open."""
    if admin_key:
        check_key(request, [admin_key], "admin key")
    else:
        check_key(request, api_keys)


def has_key(request: Request, keys: list[str]) -> bool:
    """Whether the request carries one of ``keys``; never raises."""
    if not keys:
        return False
    try:
        check_key(request, keys)
    except APIError:
        return False
    return True


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The whole body, at most ``limit`` bytes, arrived within ``timeout_s``.

    A client that sends its body slowly (or declares more than it sends) would otherwise hold a
    connection and a task for as long as it likes; it gets a 408 and the connection is closed. A body
    that had all arrived before the request's task started (most of them: it comes with the head)
    is read without arming the timer.
    """
    client = request.scope.get(CLIENT_SCOPE_KEY)
    if isinstance(client, ClientState) and client.body_complete:
        return await _read_body(request, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise APIError(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            headers={"connection": "close"},
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
    length = coding = None
    for key, value in request.scope["headers"]:
        if key == b"content-length":
            length = value if length is None else length
        elif key == b"content-encoding":  # several lines are one list, in the order they were applied
            coding = value if coding is None else coding + b"," + value
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
        if declared > limit:
            raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    body = await _receive(request, limit)
    # an empty body is empty in any coding (a GET that names one)
    return body if coding is None or not body else decoded(body, coding.decode("latin-1"), limit)


async def _receive(request: Request, limit: int) -> bytes:
    # The ASGI messages read here, not through Starlette's ``request.stream()``: that async generator
    # costs a registration with the event loop per request, and it raises ``ClientDisconnect`` for a
    # client that leaves mid-body, which no handler expects; here that client's request is a 499 like
    # every other request whose client went away.
    parts: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            part = message.get("body", b"")
            if part:
                size += len(part)
                if size > limit:
                    raise APIError(413, f"request body exceeds the limit of {limit} bytes")
                parts.append(part)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)
        elif kind == "http.disconnect":
            raise APIError(499, "client closed the request")


_GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip member
_MAX_GZIP_MEMBERS = 16
MAX_CODINGS = 4  # content codings applied one over another ("gzip, deflate"): no client needs more


def decoded(body: bytes, coding: str, limit: int) -> bytes:
    """A request body sent with ``Content-Encoding``, decoded (the codings undone last first).

    Read as the upstream would never read it: vLLM takes only plain JSON, so the body goes on decoded and
    without the header. The decoded size is held to ``limit`` as the sent one is (a few kilobytes of gzip
    can hold gigabytes of zeros); a coding the gateway does not know is a 415 naming the ones it does.
    """
    codings = [c.strip().lower() for c in coding.split(",")]
    if len(codings) > MAX_CODINGS:
        # each layer is a decoding of up to the whole limit on the event loop: a header of thousands of
        # "gzip" would stall every other request for seconds
        raise APIError(
            400,
            f"at most {MAX_CODINGS} content codings may be applied to a request body",
            param="content-encoding",
        )
    for name in reversed(codings):
        if name in ("identity", ""):
            continue
        wbits = CONTENT_CODINGS.get(name)
        if wbits is None:
            known = ", ".join(["identity", *CONTENT_CODINGS])
            raise APIError(
                415,
                f"Content-Encoding {name!r} is not supported; use one of: {known}",
                param="content-encoding",
            )
        decoder = zlib.decompressobj(window_bits(wbits, body))
        try:
            out = decoder.decompress(body, limit + 1)
            if len(out) <= limit:
                out += decoder.flush()
            # gzip allows several members one after the other (what ``cat a.gz b.gz`` makes), read as the
            # concatenation of their contents; a few of them (each sets up a decoder on the event loop: a
            # body of thousands of empty members would stall it). More are "trailed by other bytes" below.
            members = 1
            while (
                wbits == CONTENT_CODINGS["gzip"]
                and members < _MAX_GZIP_MEMBERS
                and decoder.eof
                and decoder.unused_data[:2] == _GZIP_MAGIC
                and len(out) <= limit
            ):
                members += 1
                rest, decoder = decoder.unused_data, zlib.decompressobj(wbits)
                out += decoder.decompress(rest, limit + 1 - len(out))  # at least 1: never "unlimited"
                if len(out) <= limit:
                    out += decoder.flush()
        except zlib.error as e:
            raise APIError(400, f"request body is not valid {name}: {e}", param="content-encoding") from None
        if len(out) > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes once decoded")
        if not decoder.eof or decoder.unused_data:
            raise APIError(
                400,
                f"request body is not valid {name}: it is cut short or trailed by other bytes",
                param="content-encoding",
            )
        body = out
    return body


_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)  # every digit a "0": a run of digits, a run of 0s
_RUN = 19  # digits: the shortest integer literal orjson reads as a float (-9223372036854775809)
_STRIDE = 6  # every 6th byte: a run of 19 digits holds at least 3 of them in a row


def wide_digits(body: bytes) -> bool:
    """Whether ``body`` has a run of 19 or more digits: where it might hold an integer orjson reads as
    a float.

    orjson reads an integer literal only within [-2**63, 2**64 - 1] as an integer; past that it gives
    the nearest float, silently (``98765432109876543210`` becomes ``9.876543210987654e+19``), and a
    body the gateway re-encodes would go upstream with that float, which vLLM reads as another value.
    Such a literal has at least 19 digits. Checked in C, with no parse: every 6th byte first (a run of
    19 digits covers 3 of them in a row, at most 5 bytes after its start), then, only where those show
    three digits in a row, every byte. About a third of the cost of orjson's parse on a chat, and no
    more than it on a body of numbers; a run inside a string, or a long fraction, is a false alarm,
    which costs only the slower exact parse.
    """
    if body[::_STRIDE].translate(_DIGITS).find(b"0" * 3) < 0:
        return False
    return body.translate(_DIGITS).find(b"0" * _RUN) >= 0


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    return _json_object(body)[0]


LARGE_BODY = 1 << 16
"""Bytes of a body past which it is parsed with the cyclic garbage collector paused: a body of many small
arrays or objects (in a tool's schema, ``vllm_xargs``) allocates millions of containers, and the collector
they set off took three quarters of the parse (1.4 s of the event loop for 9 MB of empty arrays). What the
parse makes holds no cycles, so nothing is left for the collector that it would have found."""

MAX_CONTAINERS = 1_000_000
"""The most ``[`` and ``{`` a large body may hold (counted in strings too: an upper bound). Even with the
collector paused a parse costs about 60 ms of the event loop per million containers; no request a model
can serve needs that many (a million token ids are one array)."""


def _json_object(body: bytes) -> tuple[dict[str, Any], bool]:
    """The body as a JSON object, and whether it was parsed exactly for integers past 64 bits.

    orjson parses and judges every body (its errors are the ones a client is told); a body that may
    hold an integer past 64 bits (:func:`wide_digits`) is then parsed again by the standard library,
    which reads integers exactly, so that the gateway forwards the integers the client sent whichever
    route the request takes. Both read any JSON orjson accepts to the same values but for those.
    """
    if not body:
        raise APIError(400, "request body is empty; expected a JSON object")
    large = len(body) > LARGE_BODY
    if large and body.count(b"[") + body.count(b"{") > MAX_CONTAINERS:
        raise APIError(400, f"request body holds more than {MAX_CONTAINERS} JSON arrays and objects")
    collecting = large and gc.isenabled()
    if collecting:
        gc.disable()
    try:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise APIError(400, f"request body is not valid JSON: {e}") from None
        wide = wide_digits(body)
        if wide:
            # valid JSON (orjson said so: no NaN, no number past a double's range, so no integer of more
            # than 309 digits) in UTF-8 without a BOM: the standard library reads it to the same values
            payload = json.loads(body)
    finally:
        if collecting:
            gc.enable()
    if not isinstance(payload, dict):
        raise APIError(400, "request body must be a JSON object")
    return payload, wide


def parse_body(body: bytes, api: Api, models: frozenset[str]) -> dict[str, Any]:
    payload, wide = _json_object(body)
    field = REQUIRED[api]
    if payload.get(field) is None and not _embeds_only(payload, api):
        raise APIError(400, f"'{field}' is a required property", param=field)
    check_types(payload, api)
    if wide:
        check_ranges(payload, api)
    check_model(payload.get("model"), models)
    return payload


def check_model(model: Any, models: frozenset[str]) -> None:
    """A 404 naming ``model`` when no pool serves it (absent or empty: the upstream's default, as vLLM
    reads an empty name); 400 if not a string."""
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", param="model")
    if model and model not in models:
        shown = model if len(model) <= 256 else model[:256] + "..."
        known = ", ".join(sorted(models))
        # vLLM 0.32's words, "aliases" included
        raise APIError(404, f"The model `{shown}` does not exist. Valid aliases: {known}.", param="model")


def _embeds_only(payload: dict[str, Any], api: Api) -> bool:
    """A completion whose prompt comes as embeddings (vLLM started with ``--enable-prompt-embeds``):
    vLLM asks for ``prompt`` or ``prompt_embeds``."""
    return api == "completions" and payload.get("prompt_embeds") is not None


def forced_pool(request: Request, allowed: bool) -> PoolName | None:
    value = header(request, b"x-specroute-pool")
    if value is None:
        return None
    if not allowed:
        raise APIError(403, "forcing a pool with x-specroute-pool is disabled", param="x-specroute-pool")
    value = value.strip().lower()
    for name in POOL_NAMES:
        if value == name:
            return name
    raise APIError(400, f"x-specroute-pool must be one of {', '.join(POOL_NAMES)}", param="x-specroute-pool")
