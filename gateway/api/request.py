"""Validating an incoming OpenAI request: auth, size, JSON, the fields routing needs.

The gateway checks only what it must to route safely; every other field passes through untouched
and the upstream validates it (its 4xx bodies reach the client unchanged).
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.requests import Request

from gateway.api.errors import APIError
from gateway.types import POOL_NAMES, Api, PoolName

REQUIRED: dict[Api, str] = {"completions": "prompt", "chat": "messages"}


def check_key(request: Request, keys: list[str], what: str = "API key") -> None:
    if not keys:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, f"missing {what}: send 'Authorization: Bearer <key>'", headers=_CHALLENGE)
    token_b = token.strip().encode()
    if not any(hmac.compare_digest(token_b, k.encode()) for k in keys):
        raise APIError(401, f"invalid {what}", headers=_CHALLENGE)


_CHALLENGE = {"www-authenticate": "Bearer"}


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
        if declared > limit:
            raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        parts.append(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def parse_body(body: bytes, api: Api, models: frozenset[str]) -> dict[str, Any]:
    if not body:
        raise APIError(400, "request body is empty; expected a JSON object")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise APIError(400, "request body must be a JSON object")
    field = REQUIRED[api]
    value = payload.get(field)
    if value is None:
        raise APIError(400, f"'{field}' is a required property", param=field)
    if api == "chat":
        if not isinstance(value, list) or not value:
            raise APIError(400, "'messages' must be a non-empty array of messages", param="messages")
    elif not isinstance(value, (str, list)):
        raise APIError(400, "'prompt' must be a string or an array", param="prompt")
    model = payload.get("model")
    if model is not None and model not in models:
        known = ", ".join(sorted(models))
        raise APIError(404, f"The model `{model}` does not exist. Valid models: {known}.", param="model")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise APIError(400, "'stream' must be a boolean", param="stream")
    return payload


def forced_pool(request: Request, allowed: bool) -> PoolName | None:
    value = request.headers.get("x-specroute-pool")
    if value is None:
        return None
    if not allowed:
        raise APIError(403, "forcing a pool with x-specroute-pool is disabled", param="x-specroute-pool")
    value = value.strip().lower()
    for name in POOL_NAMES:
        if value == name:
            return name
    raise APIError(400, f"x-specroute-pool must be one of {', '.join(POOL_NAMES)}", param="x-specroute-pool")
