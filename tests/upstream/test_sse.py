"""The SSE decoder: every line-end variant, cut anywhere between reads, relayed byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.sse import Event, EventBuffer, data_of, parse, with_data

LINE_ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def stream(eol: bytes) -> bytes:
    """Comments, named events, ids, retry, multi-line data, ``data:`` with and without its space."""
    lines = [
        b": keep-alive",
        b"",
        b'data: {"a":1}',
        b"",
        b"event: update",
        b"id: 7",
        b"retry: 1500",
        b"data:first",
        b"data: second",
        b"",
        b"",  # a second blank line dispatches nothing
        b"data: [DONE]",
        b"",
    ]
    return eol.join(lines) + eol


EXPECTED = [
    Event(),  # the comment alone: an event without data, passed on
    Event(data=b'{"a":1}'),
    Event(data=b"first\nsecond", event="update", id="7", retry=1500),
    Event(data=b"[DONE]"),
]


def decode(reads: list[bytes]) -> tuple[list[Event], list[bytes], bytes]:
    """Parsed events, their bytes, and every byte :meth:`EventBuffer.feed` said to pass on."""
    sse = EventBuffer()
    events: list[bytes] = []
    relayed = b""
    for raw in reads:
        got, span = sse.feed(raw)
        events += got
        relayed += span
    return [parse(e) for e in events], events, relayed


@pytest.mark.parametrize("eol", LINE_ENDS.values(), ids=LINE_ENDS.keys())
def test_one_read(eol: bytes) -> None:
    data = stream(eol)
    events, _, relayed = decode([data])
    assert events == EXPECTED
    assert relayed == data  # every event was whole: all of it goes on, unchanged


@pytest.mark.parametrize("eol", LINE_ENDS.values(), ids=LINE_ENDS.keys())
def test_byte_by_byte(eol: bytes) -> None:
    data = stream(eol)
    events, _, relayed = decode([data[i : i + 1] for i in range(len(data))])
    assert events == EXPECTED
    assert relayed == data


def test_crlf_cut_between_cr_and_lf() -> None:
    """A blank line's ``\\r`` ends the event at once; the ``\\n`` arriving next is not another blank line."""
    sse = EventBuffer()
    events, span = sse.feed(b"data: a\r\n\r")
    assert [data_of(e) for e in events] == [b"a"] and span == b"data: a\r\n\r"
    events, span = sse.feed(b"\n")
    assert events == [] and span == b"\n"
    events, span = sse.feed(b"data: b\r\n\r\n")
    assert [data_of(e) for e in events] == [b"b"] and span == b"data: b\r\n\r\n"


def test_unfinished_event_waits_and_is_left_at_the_end() -> None:
    sse = EventBuffer()
    assert sse.feed(b'data: {"x"') == ([], b"")
    assert sse.feed(b":1}\n") == ([], b"")
    assert sse.feed(b"\ndata: par") == ([b'data: {"x":1}'], b'data: {"x":1}\n\n')
    assert sse.rest() == b"data: par"
    assert sse.rest() == b""


def test_mixed_line_ends_in_one_stream() -> None:
    data = b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: d\n\r\n"
    events, _, relayed = decode([data])
    assert [e.data for e in events] == [b"a", b"b", b"c", b"d"]
    assert relayed == data


def test_field_details() -> None:
    assert parse(b"data").data == b""  # a field name alone: empty value
    assert parse(b"data:  two spaces").data == b" two spaces"  # only one space is dropped
    assert parse(b"id: a\0b").id is None  # an id with NUL is ignored
    assert parse(b"retry: soon\ndata: x").retry is None
    assert parse(b"unknown: x\ndata: y") == Event(data=b"y")
    assert data_of(b"event: ping") is None


@pytest.mark.parametrize("eol", LINE_ENDS.values(), ids=LINE_ENDS.keys())
def test_buffer_data_matches_the_general_reader(eol: bytes) -> None:
    sse = EventBuffer()
    events, _ = sse.feed(stream(eol))
    assert [sse.data(e) for e in events] == [data_of(e) for e in events] == [e.data for e in EXPECTED]


def test_with_data_keeps_other_fields() -> None:
    assert with_data(b'data: {"a":1}', b"{}") == b"data: {}"
    assert with_data(b"data:x", b"y") == b"data: y"
    changed = with_data(b"event: update\r\nid: 7\r\ndata: a\r\ndata: b", b"c")
    assert parse(changed) == Event(data=b"c", event="update", id="7")
    sse = EventBuffer()
    (event,), _ = sse.feed(b"event: e\ndata: a\n\n")
    assert parse(sse.with_data(event, b"z")) == Event(data=b"z", event="e")


@given(
    eol=st.sampled_from(list(LINE_ENDS.values())),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_cut_gives_the_same_events_and_bytes(eol: bytes, cuts: list[int]) -> None:
    data = stream(eol) * 2
    points = sorted(min(c, len(data)) for c in cuts)  # a repeated point is an empty read
    reads = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    events, _, relayed = decode(reads)
    assert events == EXPECTED * 2
    assert relayed == data


@pytest.mark.parametrize("eol", LINE_ENDS.values(), ids=LINE_ENDS.keys())
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_a_large_event_in_small_reads_comes_out_whole(eol: bytes, size: int) -> None:
    # the reads of an unfinished event are kept apart until one can end it: every seam between them
    # (a line end split across reads, a blank line's two halves in two reads) must still be seen
    big = b"data: " + b"x" * 3000 + eol + b"data: " + b"y" * 500 + eol + eol
    data = stream(eol) + big + stream(eol)
    reads = [data[i : i + size] for i in range(0, len(data), size)]
    events, _, relayed = decode(reads)
    assert events == [*EXPECTED, Event(data=b"x" * 3000 + b"\n" + b"y" * 500), *EXPECTED]
    assert relayed == data


def test_the_rest_of_a_stream_holds_every_read_of_its_unfinished_event() -> None:
    sse = EventBuffer()
    assert sse.feed(b"data: [DONE]\n\ndata: par") == ([b"data: [DONE]"], b"data: [DONE]\n\n")
    assert sse.feed(b"tial ev") == ([], b"")
    assert sse.feed(b"ent\n") == ([], b"")
    assert sse.rest() == b"data: partial event\n"
    assert sse.feed(b"data: next\n\n") == ([b"data: next"], b"data: next\n\n")


def test_an_empty_read_inside_an_unfinished_event_hides_no_line_end() -> None:
    sse = EventBuffer()
    assert sse.feed(b"data: a\n") == ([], b"")
    assert sse.feed(b"data: b\n") == ([], b"")
    assert sse.feed(b"") == ([], b"")
    assert sse.feed(b"\n") == ([b"data: a\ndata: b"], b"data: a\ndata: b\n\n")
