"""Metering vLLM's Responses stream: bytes pass unchanged, TTFT at the first delta, usage at the end."""

from __future__ import annotations

import logging
from time import perf_counter

import orjson
import pytest

from gateway.upstream.events import EventMeter


def _event(kind: str, **body: object) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **body}) + b"\n\n"


def _stream(text_pieces: list[str], output_tokens: int) -> bytes:
    usage = {"input_tokens": 9, "output_tokens": output_tokens, "total_tokens": 9 + output_tokens}
    parts = [_event("response.created", response={"status": "in_progress"}, sequence_number=0)]
    parts += [
        _event("response.output_text.delta", delta=t, sequence_number=i + 1)
        for i, t in enumerate(text_pieces)
    ]
    parts.append(_event("response.completed", response={"status": "completed", "usage": usage}))
    return b"".join(parts)


def test_bytes_pass_unchanged_whole_events_only_and_are_measured() -> None:
    raw = _stream(["Hel", "lo", " world"], output_tokens=5)
    meter = EventMeter(perf_counter())
    out = b""
    for i in range(0, len(raw), 7):  # arbitrary cuts, as a network delivers them
        piece = meter.feed(raw[i : i + 7])
        assert piece == b"" or piece.endswith(b"\n\n")
        out += piece
    out += meter.flush()
    assert out == raw
    assert meter.first_token_at is not None and meter.chunks == 3
    assert meter.completion_tokens == 5 and meter.prompt_tokens == 9 and meter.done


def test_no_delta_no_ttft() -> None:
    meter = EventMeter(perf_counter())
    meter.feed(_event("response.created", response={}))
    assert meter.first_token_at is None and not meter.done


def test_server_error_events_lose_their_text_client_errors_keep_it() -> None:
    meter = EventMeter(perf_counter())
    server = _event("error", code="500", message="Traceback at /srv/vllm/engine.py", sequence_number=4)
    out = meter.feed(server)
    assert b"Traceback" not in out and b"/srv" not in out
    data = orjson.loads(out.split(b"\ndata: ")[1])
    assert data["type"] == "error" and data["code"] == "500" and data["sequence_number"] == 4
    assert meter.error is not None
    client = _event("error", code="400", message="max_output_tokens is too large")
    assert EventMeter(perf_counter()).feed(client) == client


def test_a_server_errors_text_reaches_the_log_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """The text may repeat the client's input: a line break in it would forge a log line, an escape
    sequence would act on the terminal showing the log."""
    forged = "bad input: x\n2026-01-01 00:00:00,000 ERROR specroute.server: forged \x1b[31mred"
    with caplog.at_level(logging.WARNING, logger="specroute.upstream"):
        EventMeter(perf_counter()).feed(_event("error", code="500", message=forged))
    (record,) = caplog.records
    message = record.getMessage()
    assert "\n" not in message and "\x1b" not in message
    assert message.endswith(repr(forged))


def test_the_response_created_event_tells_the_response_id() -> None:
    ids: list[str] = []
    meter = EventMeter(perf_counter(), on_created=ids.append)
    raw = b"".join(
        [
            _event("response.created", response={"id": "resp_7", "status": "in_progress"}),
            _event("response.output_text.delta", delta="Hi"),
            _event("response.completed", response={"id": "resp_7", "status": "completed"}),
        ]
    )
    out = b"".join(meter.feed(raw[i : i + 5]) for i in range(0, len(raw), 5)) + meter.flush()
    assert out == raw and ids == ["resp_7"]
    unnamed = EventMeter(perf_counter(), on_created=ids.append)
    unnamed.feed(_event("response.created", response={"status": "in_progress"}))
    unnamed.feed(b"event: response.created\ndata: {\n\n")
    assert ids == ["resp_7"]  # an event without an id (or not JSON) tells nothing
