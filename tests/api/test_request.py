"""Request headers read straight from the ASGI scope say what Starlette's ``Headers`` says; a body is read
whole, within its limits, and decoded when it was sent compressed."""

from __future__ import annotations

import gc
import gzip
import json
import multiprocessing
import re
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from gateway.api.errors import APIError
from gateway.api.request import (
    MAX_CONTAINERS,
    MAX_REQUEST_ID,
    decoded,
    header,
    json_object,
    new_request_id,
    read_body,
    request_id,
    trace_id,
    wide_digits,
)
from tests.api.conftest import API_KEY, MODEL, InProcess

AUTH = {"authorization": f"Bearer {API_KEY}"}

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


def _with_id(value: bytes) -> Request:
    return Request({"type": "http", "headers": [(b"x-request-id", value)]})


@pytest.mark.parametrize(
    "value", [b"req-42", b"0f8fad5b-d9cb-469f-a165-70867728950e", b'a "quoted" id', b"x" * MAX_REQUEST_ID]
)
def test_a_client_request_id_is_kept(value: bytes) -> None:
    assert request_id(_with_id(value)) == value.decode()


@pytest.mark.parametrize(
    "value",
    [b"", b"caf\xe9-1", "caf\u00e9".encode(), b"a\tb", b"a\x1bb", b"x" * (MAX_REQUEST_ID + 1), b"x" * 20_000],
)
def test_a_client_request_id_that_is_no_plausible_id_is_replaced(value: bytes) -> None:
    # it would travel into the response, upstream and into every access-log line
    rid = request_id(_with_id(value))
    assert len(rid) == 16 and rid != value.decode("latin-1")
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


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", _gzip),
        ("x-gzip", _gzip),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b, wbits=-zlib.MAX_WBITS)),  # raw, without zlib's header
        ("GZIP ", _gzip),
        ("identity", lambda b: b),
        ("gzip, deflate", lambda b: zlib.compress(_gzip(b))),
        ("gzip", lambda b: _gzip(b[:7]) + _gzip(b"") * 14 + _gzip(b[7:])),  # 16 members one after another
    ],
)
def test_a_compressed_body_is_decoded(coding: str, encode: Any) -> None:
    body = b'{"prompt": "' + b"ab" * 500 + b'"}'
    assert decoded(encode(body), coding, 10_000) == body


@pytest.mark.parametrize(
    ("coding", "sent", "status", "says"),
    [
        ("br", b"\x0b\x02\x80{}\x03", 415, "use one of: identity, gzip, x-gzip, deflate"),
        ("gzip, zstd", b"{}", 415, "'zstd' is not supported"),
        ("gzip", b'{"prompt": "plain"}', 400, "not valid gzip"),
        ("gzip", _gzip(b'{"prompt": "cut"}')[:-6], 400, "cut short"),
        ("gzip", _gzip(b"{}") + b"more", 400, "trailed by other bytes"),
        ("gzip", _gzip(b"{}") + _gzip(b"{}")[:-3], 400, "cut short"),
        ("gzip", _gzip(b"{}") + _gzip(b"{}") + b"\0", 400, "trailed by other bytes"),
        ("deflate", zlib.compress(b"{}") + zlib.compress(b"{}"), 400, "trailed by other bytes"),
        ("gzip", _gzip(b"\0" * 6_000) + _gzip(b"\0" * 4_001), 413, "once decoded"),
        ("gzip", _gzip(b"\0" * 10_000) + _gzip(b"\0" * 10**6), 413, "once decoded"),
        ("gzip", _gzip(b"{}") + _gzip(b"") * 16, 400, "trailed by other bytes"),  # 17 members
        ("deflate", zlib.compress(b"\0" * 1_000_000), 413, "limit of 10000 bytes once decoded"),
        ("gzip", _gzip(b"\0" * 10_001), 413, "once decoded"),
    ],
)
def test_a_body_that_cannot_be_decoded_says_why(coding: str, sent: bytes, status: int, says: str) -> None:
    with pytest.raises(APIError) as e:
        decoded(sent, coding, 10_000)
    assert e.value.status == status and says in e.value.message
    assert e.value.param == ("content-encoding" if status != 413 else None)


def test_codings_one_over_another_are_held_to_a_few() -> None:
    body = b'{"prompt": "x"}'
    four = zlib.compress(_gzip(zlib.compress(_gzip(body))))
    assert decoded(four, "gzip, deflate, gzip, deflate", 10_000) == body
    with pytest.raises(APIError) as e:
        decoded(body, ", ".join(["identity"] * 5), 10_000)  # refused before any is undone
    assert e.value.status == 400 and e.value.param == "content-encoding"
    assert "at most 4 content codings" in e.value.message


def test_a_body_at_the_limit_once_decoded_is_read() -> None:
    assert decoded(_gzip(b"\0" * 10_000), "gzip", 10_000) == b"\0" * 10_000


async def test_an_empty_body_is_empty_in_any_coding_and_a_sent_one_is_decoded() -> None:
    def request(body: bytes) -> Request:
        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": body, "more_body": False}

        return Request({"type": "http", "headers": [(b"content-encoding", b"gzip")]}, receive)

    assert await read_body(request(b""), 100) == b""
    assert await read_body(request(_gzip(b'{"a": 1}')), 100) == b'{"a": 1}'


def test_a_compressed_completion_goes_upstream_decoded(gateway: InProcess) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": "Say hi.", "max_tokens": 4})
    for coding, sent in (("gzip", _gzip(body)), ("deflate", zlib.compress(body))):
        seen = sum(len(u.heads) for u in gateway.upstreams)
        headers = {**AUTH, "content-type": "application/json", "content-encoding": coding}
        r = gateway.request("POST", "/v1/completions", content=sent, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"]
        heads = [h for u in gateway.upstreams for p, h in u.heads if p == "/v1/completions"]
        assert sum(len(u.heads) for u in gateway.upstreams) > seen
        assert b"content-encoding" not in heads[-1]
    r = gateway.request("POST", "/v1/completions", content=body, headers={**AUTH, "content-encoding": "br"})
    assert r.status_code == 415
    assert r.json()["error"]["param"] == "content-encoding" and "'br'" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "literal",
    [
        b"98765432109876543210",  # past 2**64 - 1
        b"18446744073709551616",  # 2**64
        b"-9223372036854775809",  # below -2**63: 19 digits
        b"-9999999999999999999",
        b"12345678901234567890123",
        b"1" + b"0" * 300,  # a googol cubed: still within a double's range, read exactly
    ],
)
def test_an_integer_past_64_bits_is_read_exactly_wherever_it_is(literal: bytes) -> None:
    # orjson reads these as the nearest float, which a re-encoded body would then carry upstream
    body = b'{"a": %s, "b": {"c": [1, %s]}, "d": "%s"}' % (literal, literal, literal)
    payload = json_object(body)
    assert payload == {"a": int(literal), "b": {"c": [1, int(literal)]}, "d": literal.decode()}
    assert type(payload["a"]) is int and type(payload["b"]["c"][1]) is int


@pytest.mark.parametrize(
    "body",
    [
        b'{"seed": 18446744073709551615, "n": -9223372036854775808, "x": 1.5}',  # the 64-bit bounds
        b'{"id": "12345678901234567890123", "t": 0.1000000000000000055511151231257827, "f": 1e300}',
        b'{"s": "\\u00e9 caf\\u00e9 \\n", "u": "\\ud83d\\ude00", "e": [], "o": {}, "z": -0.0}',
        b'{"p": 12345678901234567890123e-5, "q": 98765432109876543210.5, "big": 1e19}',
    ],
)
def test_the_exact_parse_reads_every_other_value_as_orjson_does(body: bytes) -> None:
    # the bodies with a run of 19 digits take the standard library's parse: the same values
    wide = json_object(b'{"pad": "0000000000000000000", "v": %s}' % body)["v"]
    assert wide == orjson.loads(body) == json.loads(body)
    assert [type(v) for v in wide.values()] == [type(v) for v in orjson.loads(body).values()]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"a": 1' + b"1" * 400 + b"}", "not valid JSON"),  # past a double: orjson's error, a 400
        (b'{"a": 1' + b"1" * 5000 + b"}", "not valid JSON"),  # past the standard library's 4,300 digits
        (b'{"a": 11111111111111111111, "b": NaN}', "not valid JSON"),
        (b'{"a": "\\ud800", "b": 11111111111111111111}', "not valid JSON"),  # a lone surrogate
        (b"\xef\xbb\xbf" + b'{"a": 11111111111111111111}', "not valid JSON"),  # a byte order mark
        (b"[11111111111111111111]", "must be a JSON object"),
    ],
)
def test_a_body_with_a_long_integer_is_judged_as_any_other(body: bytes, says: str) -> None:
    with pytest.raises(APIError) as e:
        json_object(body)
    assert e.value.status == 400 and says in e.value.message


@given(st.binary().map(lambda b: b.translate(bytes.maketrans(bytes(range(256)), b"0123456789 ,-.e:" * 16))))
def test_the_sampled_check_finds_every_run_of_19_digits(body: bytes) -> None:
    # every 6th byte first, then every byte: the same answer as looking at every byte at once
    assert wide_digits(body) == (re.search(rb"[0-9]{19}", body) is not None)
    assert wide_digits(b"x" * (len(body) % 7) + b"5" * 19 + body)


def test_a_large_body_of_many_containers_is_parsed_without_the_collector() -> None:
    """Millions of small arrays set off the cyclic collector thousands of times in one parse (three quarters
    of its time, on the event loop); a JSON parse makes no cycles, so it runs with the collector paused,
    which is on again after it."""
    body = b'{"model": "m", "prompt": "hi", "vllm_xargs": {"l": [' + b",".join([b"[]"] * 200_000) + b"]}}"
    collections: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(phase)

    gc.callbacks.append(seen)
    try:
        payload = json_object(body)
    finally:
        gc.callbacks.remove(seen)
    assert len(payload["vllm_xargs"]["l"]) == 200_000 and collections == [] and gc.isenabled()


def test_a_body_of_more_containers_than_any_request_needs_is_refused() -> None:
    body = b'{"model": "m", "prompt": "hi", "tools": [' + b",".join([b"{}"] * (MAX_CONTAINERS + 1)) + b"]}"
    with pytest.raises(APIError) as e:
        json_object(body)
    assert e.value.status == 400 and "more than 1000000 JSON arrays and objects" in e.value.message
    assert gc.isenabled()
