"""Request headers read straight from the ASGI scope say what Starlette's ``Headers`` says."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.api.request import header

RAW = [
    (b"host", b"gw:8000"),
    (b"x-request-id", b"caf\xe9-1"),
    (b"x-request-id", b"second"),
    (b"content-length", b"12"),
    (b"x-empty", b""),
]


@pytest.mark.parametrize("name", ["x-request-id", "content-length", "x-empty", "host", "authorization"])
def test_a_header_is_read_as_starlette_reads_it(name: str) -> None:
    request = Request({"type": "http", "headers": list(RAW)})
    assert header(request, name.encode()) == request.headers.get(name)


def test_the_first_of_repeated_headers_counts_and_an_absent_one_is_none() -> None:
    request = Request({"type": "http", "headers": list(RAW)})
    assert header(request, b"x-request-id") == "caf\xe9-1"
    assert header(request, b"x-specroute-pool") is None
