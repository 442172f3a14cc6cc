"""OpenAI-shaped errors made by the gateway itself.

Upstream 4xx bodies pass through untouched; these are for what the gateway decides on its own (bad
input, auth) and for upstream failures it could not hide (:func:`from_upstream`, the one mapping from
:mod:`gateway.errors` to statuses). The shape matches vLLM's, so a client sees one format.
"""

from __future__ import annotations

import math
from http import HTTPStatus

import orjson
from starlette.responses import Response

from gateway.errors import (
    ModelNotServed,
    NoEndpoint,
    Unreachable,
    UpstreamError,
    UpstreamStatus,
    UpstreamTimeout,
)

# vLLM names its error types after the HTTP status (BadRequestError, NotFoundError, ...).
_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    499: "ClientClosedRequest",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class APIError(Exception):
    """Raised anywhere on the request path; rendered as an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}
        self.body = body  # the upstream's own error body, sent as it came in the place of the gateway's


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    etype = _TYPES.get(status) or _phrase(status)
    return orjson.dumps({"error": {"message": message, "type": etype, "param": param, "code": status}})


def openai_shaped(content: bytes) -> bool:
    """Whether an upstream's error body is OpenAI-shaped (``{"error": {...}}``): what every OpenAI client
    reads the message of."""
    try:
        return isinstance(orjson.loads(content).get("error"), dict)
    except (orjson.JSONDecodeError, AttributeError):
        return False


def route_missing_body(status: int, method: str, path: str) -> bytes:
    """The API's error for an upstream's 404 or 405 that is not OpenAI-shaped: a server without the route
    (FastAPI's ``{"detail": "Not Found"}``, which no OpenAI client reads as an error message)."""
    what = "no route" if status == 404 else "method not allowed on"
    return error_body(status, f"{what} {method} {path}")


def client_error_body(status: int, content: bytes) -> bytes:
    """The API's error for an upstream's other 4xx that is not OpenAI-shaped (vLLM's ``--api-key``
    middleware answers 401 with ``{"error": "Unauthorized"}``): its text, where it has one, as the message."""
    try:
        parsed = orjson.loads(content)
    except orjson.JSONDecodeError:
        parsed = None
    said = parsed.get("error") or parsed.get("detail") if isinstance(parsed, dict) else None
    if isinstance(said, str) and said:
        return error_body(status, said[:1000])
    try:
        return error_body(status, HTTPStatus(status).phrase)
    except ValueError:  # a status Python has no name for
        return error_body(status, f"the upstream answered HTTP {status}")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.replace(" ", "") + "Error"
    except ValueError:
        return "Error"


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Response:
    """An OpenAI-shaped error; ``body``, an upstream's own (:attr:`APIError.body`), in the place of the
    one the gateway would write."""
    content = error_body(status, message, param) if body is None else body
    return Response(content, status, headers=headers, media_type="application/json")


def sse_error_event(status: int, message: str) -> bytes:
    """An error reported inside a stream that has already started (vLLM does the same)."""
    return b"data: " + error_body(status, message) + b"\n\ndata: [DONE]\n\n"


def responses_error_event(status: int, message: str) -> bytes:
    """The same inside a Responses stream: an ``error`` event whose ``code`` is the HTTP status."""
    data = {"type": "error", "code": str(status), "message": message, "param": None}
    return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


def from_upstream(error: UpstreamError) -> APIError:
    """What a client is told of an upstream failure: the one place that maps them to statuses.

    Nothing answered or nothing was left to try: 503; silence: 504; a busy or failed status: that status
    when it is one a gateway passes on (429, 502, 503, 504), else 502, and a 429 with the upstream's own
    body when it kept one (vLLM's rate-limit message is the client's to read, as any 4xx is); no
    endpoint tried serves the model: 404 on ``model``; anything broken: 502. A wait worth making before
    trying again (busy pools) goes out as ``Retry-After``, which the OpenAI SDKs honour.
    """
    headers = None
    if error.retry_after_s is not None:
        headers = {"retry-after": str(max(1, math.ceil(error.retry_after_s)))}
    if isinstance(error, UpstreamStatus):
        status = error.status if error.status in (429, 502, 503, 504) else 502
        return APIError(status, error.message, headers=headers, body=error.body)
    if isinstance(error, ModelNotServed):
        return APIError(404, error.message, param="model")
    if isinstance(error, NoEndpoint | Unreachable):
        return APIError(503, error.message, headers=headers)
    if isinstance(error, UpstreamTimeout):
        return APIError(504, error.message)
    return APIError(502, error.message)
