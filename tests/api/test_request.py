"""Request headers read straight from the ASGI scope say what Starlette's ``Headers`` says."""

from __future__ import annotations

import multiprocessing

import pytest
from starlette.requests import Request

from gateway.api.errors import APIError
from gateway.api.request import header, new_request_id, read_body, request_id, trace_id

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


def test_new_request_ids_are_random_hex_and_never_repeat() -> None:
    ids = [new_request_id() for _ in range(3000)]  # several draws from the system
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 16 and int(i, 16) >= 0 and i == i.lower() for i in ids)


def test_a_forked_worker_draws_its_own_request_ids() -> None:
    new_request_id()  # the parent has ids drawn and waiting
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=lambda: child.send(new_request_id()))
    proc.start()
    theirs = parent.recv()
    proc.join(10)
    assert theirs != new_request_id()


def test_a_client_request_id_is_kept() -> None:
    request = Request({"type": "http", "headers": list(RAW)})
    assert request_id(request) == "caf\xe9-1"
    assert len(request_id(Request({"type": "http", "headers": []}))) == 16


def _receiving(*messages: dict[str, object]) -> Request:
    queue = list(messages)

    async def receive() -> dict[str, object]:
        return queue.pop(0)

    return Request({"type": "http", "headers": []}, receive)


async def test_a_body_is_read_whole_from_its_messages() -> None:
    parts = _receiving(
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b" 1}", "more_body": False},
    )
    assert await read_body(parts, 100) == b'{"a": 1}'
    assert await read_body(_receiving({"type": "http.request"}), 100) == b""


async def test_a_client_gone_mid_body_is_a_499_and_a_body_over_the_limit_a_413() -> None:
    gone = _receiving(
        {"type": "http.request", "body": b'{"a":', "more_body": True}, {"type": "http.disconnect"}
    )
    with pytest.raises(APIError) as e:
        await read_body(gone, 100)
    assert e.value.status == 499
    large = _receiving(
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": False},
    )
    with pytest.raises(APIError) as e:
        await read_body(large, 100)
    assert e.value.status == 413


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        (
            " 01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more ",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # all zeros: invalid
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # version ff: invalid
        (" ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # however it is spaced
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),  # upper case: invalid
        ("00-4bf92f35-00f067aa0ba902b7-01", None),
        ("not a trace", None),
        (None, None),
    ],
)
def test_the_trace_id_is_read_from_a_valid_traceparent_only(
    traceparent: str | None, expected: str | None
) -> None:
    headers = [] if traceparent is None else [(b"traceparent", traceparent.encode())]
    assert trace_id(Request({"type": "http", "headers": headers})) == expected
