"""What can go wrong upstream, said without HTTP: the API edge decides what a client is told.

The bottom of the package beside :mod:`gateway.types`: upstream code raises these, routing may look at
them, and only :mod:`gateway.api.errors` maps them to statuses and OpenAI-shaped bodies. Messages say
what happened in words fit for a client; they never name an endpoint or an address (those go to the log).
"""

from __future__ import annotations


class UpstreamError(Exception):
    """An upstream failure the gateway could not hide by trying elsewhere.

    ``retry_after_s``: when trying again is worth it, how soon (the pools were busy, or had no endpoint).
    """

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class NoEndpoint(UpstreamError):
    """No endpoint of the candidate pools could be tried at all."""


class Unreachable(UpstreamError):
    """Every endpoint tried refused or dropped the connection before answering."""


class UpstreamTimeout(UpstreamError):
    """The upstream sent nothing (or stopped sending) within its time budget."""


class UpstreamBroken(UpstreamError):
    """The connection broke, or the response ended before it was complete."""


class UpstreamTooLarge(UpstreamBroken):
    """The upstream's answer is larger than the gateway may hold (``limits.max_response_bytes``).

    Not sent again: the same request would get the same answer.
    """


class ModelNotServed(UpstreamError):
    """Every endpoint tried said it does not serve the request's model, which the configuration lists.

    ``message`` is the upstream's own (a 4xx body is the client's to read, as vLLM wrote it).
    """


class UpstreamStatus(UpstreamError):
    """The upstream answered with a server error or a busy status on every try.

    ``body``: the upstream's own OpenAI-shaped error body, for the client to read as it came, when the
    status is a 429 (a 4xx is the client's to read, as vLLM wrote it; a 5xx's text may hold a trace or
    an address and goes to the log only); else None, and ``message`` says what happened.
    """

    def __init__(
        self, status: int, message: str, retry_after_s: float | None = None, body: bytes | None = None
    ):
        super().__init__(message, retry_after_s)
        self.status = status
        self.body = body


class RequestNotEncodable(Exception):
    """A request body the gateway read but cannot write back out as JSON to send upstream.

    JSON nested deeper than any encoder at hand goes (orjson reads 1,024 levels and writes 254; the
    standard library's encoder takes over up to Python's recursion limit): the client's to fix, a 400.
    """
