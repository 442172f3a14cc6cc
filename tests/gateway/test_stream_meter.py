"""The stream meter against real vLLM 0.32 captures."""

from __future__ import annotations

import orjson
import pytest

from gateway.upstream.stream import StreamMeter, leading_error, request_usage, server_error


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def _feed_in_pieces(meter: StreamMeter, raw: bytes, size: int) -> bytes:
    out = b"".join(meter.feed(raw[i : i + size]) for i in range(0, len(raw), size))
    return out + meter.flush()


@pytest.mark.parametrize("size", [7, 100, 1 << 20])
@pytest.mark.parametrize(
    "name",
    [
        "draftsame_completion_stream_greedy_tokenids.sse",
        "ngram_chat_stream_usage.sse",
        "nospec_completion_stream_greedy_usage.sse",
        "draftother_chat_stream_usage.sse",
    ],
)
def test_strips_usage_the_client_did_not_ask_for(vllm_fixture, name, size):
    raw = vllm_fixture(name)
    meter = StreamMeter(0.0, keep_usage_chunk=False, keep_continuous=False)
    out = _feed_in_pieces(meter, raw, size)
    before = [orjson.loads(e[6:]) for e in _events(raw) if e != b"data: [DONE]"]
    after = [orjson.loads(e[6:]) for e in _events(out) if e != b"data: [DONE]"]
    assert out.endswith(b"data: [DONE]\n\n")
    assert all("usage" not in chunk for chunk in after)
    expected = [{k: v for k, v in c.items() if k != "usage"} for c in before if c["choices"]]
    # vLLM without usage puts the last chunk's extra members (system_fingerprint) on the finishing chunk.
    extras = {
        k: v
        for k, v in before[-1].items()
        if k not in ("id", "object", "created", "model", "choices", "usage")
    }
    expected[-1].update(extras)
    assert after == expected
    assert not extras or list(after[-1])[-len(extras) :] == list(extras)
    # Token accounting: the steps add up to the server's final count.
    final = before[-1]["usage"]["completion_tokens"]
    assert meter.completion_tokens == final
    assert sum(meter.token_steps) == final
    assert meter.done


def test_passes_bytes_through_untouched_when_client_asked_for_everything(vllm_fixture):
    raw = vllm_fixture("draftsame_chat_stream_usage.sse")
    meter = StreamMeter(0.0, keep_usage_chunk=True, keep_continuous=True)
    assert _feed_in_pieces(meter, raw, 13) == raw
    last = orjson.loads(_events(raw)[-2][6:])
    assert meter.completion_tokens == last["usage"]["completion_tokens"] == sum(meter.token_steps)


def test_speculation_shows_several_tokens_per_step(vllm_fixture):
    spec = StreamMeter(0.0, False, False)
    _feed_in_pieces(spec, vllm_fixture("draftsame_completion_stream_greedy_tokenids.sse"), 1 << 20)
    base = StreamMeter(0.0, False, False)
    _feed_in_pieces(base, vllm_fixture("nospec_completion_stream_greedy_usage.sse"), 1 << 20)
    assert max(base.token_steps) == 1
    assert sum(spec.token_steps) / len(spec.token_steps) > 3


def test_keeps_final_usage_chunk_when_asked(vllm_fixture):
    raw = vllm_fixture("nospec_completion_stream_greedy_usage.sse")
    meter = StreamMeter(0.0, keep_usage_chunk=True, keep_continuous=False)
    out = _feed_in_pieces(meter, raw, 64)
    chunks = [orjson.loads(e[6:]) for e in _events(out) if e != b"data: [DONE]"]
    assert "usage" in chunks[-1] and chunks[-1]["choices"] == []
    assert all("usage" not in c for c in chunks[:-1])


def test_error_event_is_recorded_and_forwarded():
    meter = StreamMeter(0.0, False, False)
    event = b'data: {"error": {"message": "boom", "type": "BadRequestError", "code": 400}}\n\n'
    assert meter.feed(event) == event
    assert meter.error is not None and meter.error["message"] == "boom"


@pytest.mark.parametrize(
    ("options", "usage", "continuous"),
    [
        (None, False, False),
        ({"include_usage": True}, True, False),
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
        ({"continuous_usage_stats": True}, False, False),
    ],
)
def test_request_usage_rewrites_stream_options(options, usage, continuous):
    payload = {"model": "m", "prompt": "x", "stream": True, "vllm_xargs": {"a": 1}}
    if options is not None:
        payload["stream_options"] = options
    body, wants_usage, wants_continuous = request_usage(payload)
    sent = orjson.loads(body)
    assert sent["stream_options"]["include_usage"] is True
    assert sent["stream_options"]["continuous_usage_stats"] is True
    assert sent["vllm_xargs"] == {"a": 1}
    assert (wants_usage, wants_continuous) == (usage, continuous)


@pytest.mark.parametrize("size", [5, 1 << 20])
@pytest.mark.parametrize(
    "name", ["nospec_completion_stream_greedy_tokenids.sse", "draftsame_completion_stream_t1_tokenids.sse"]
)
def test_strips_token_ids_the_client_did_not_ask_for(vllm_fixture, name, size):
    """Ids asked for by the gateway (to resume a stream exactly) leave as vLLM's ``null``s."""
    raw = vllm_fixture(name)
    meter = StreamMeter(0.0, strip_token_ids=True)
    out = _feed_in_pieces(meter, raw, size)
    assert b'token_ids":[' not in out
    got, want = _events(out), _events(raw)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w == b"data: [DONE]":
            assert g == w
            continue
        expected = orjson.loads(w[len(b"data: ") :])
        for choice in expected["choices"]:
            choice["prompt_token_ids"] = choice["token_ids"] = None
        assert orjson.loads(g[len(b"data: ") :]) == expected
        assert g == b"data: " + orjson.dumps(expected)  # byte for byte: nothing else re-encoded


@pytest.mark.parametrize("keep", [True, False])
def test_a_server_error_event_reaches_the_client_without_its_text(keep: bool) -> None:
    """A 5xx error event's message (a trace, a path) is for the log; a 4xx one is the client's."""
    chunk = b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[]}\n\n'
    server = (
        b'data: {"error":{"message":"CUDA error at /srv/vllm/worker.py:42",'
        b'"type":"InternalServerError","code":500}}\n\n'
    )
    client = b'data: {"error":{"message":"max_tokens is too large","type":"BadRequestError","code":400}}\n\n'
    meter = StreamMeter(0.0, keep_usage_chunk=keep, keep_continuous=keep)
    out = meter.feed(chunk + server) + meter.feed(client + b"data: [DONE]\n\n")
    assert b"/srv/vllm" not in out and b"CUDA" not in out
    assert b'"code":500' in out and b"InternalServerError" in out
    assert client in out and out.endswith(b"data: [DONE]\n\n")
    assert meter.error is not None and meter.error["code"] == 400  # the last error seen, as it came


def _with_line_ends(raw: bytes, eol: bytes) -> bytes:
    return raw.replace(b"\n", eol)


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("size", [1, 13, 1 << 20])
def test_any_line_ends_pass_through_unchanged_and_are_measured(vllm_fixture, eol, size):
    plain = vllm_fixture("draftsame_chat_stream_usage.sse")
    raw = _with_line_ends(plain, eol)
    reference = StreamMeter(0.0)
    _feed_in_pieces(reference, plain, 1 << 20)
    meter = StreamMeter(0.0)
    assert _feed_in_pieces(meter, raw, size) == raw
    assert meter.completion_tokens == reference.completion_tokens
    assert meter.token_steps == reference.token_steps and meter.chunks == reference.chunks and meter.done


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_any_line_ends_have_usage_stripped(vllm_fixture, eol):
    plain = vllm_fixture("ngram_chat_stream_usage.sse")
    expected = _feed_in_pieces(StreamMeter(0.0, keep_usage_chunk=False, keep_continuous=False), plain, 100)
    meter = StreamMeter(0.0, keep_usage_chunk=False, keep_continuous=False)
    out = _feed_in_pieces(meter, _with_line_ends(plain, eol), 100)
    # the rewritten events end in "\n\n"; what is inside each event is the same
    assert out.replace(b"\r\n", b"\n").replace(b"\r", b"\n") == expected
    assert meter.done and b'"usage"' not in out


def test_data_without_a_space_is_read(vllm_fixture):
    plain = vllm_fixture("draftsame_chat_stream_usage.sse")
    raw = plain.replace(b"data: ", b"data:")
    reference, meter = StreamMeter(0.0), StreamMeter(0.0)
    _feed_in_pieces(reference, plain, 1 << 20)
    assert _feed_in_pieces(meter, raw, 9) == raw
    assert meter.token_steps == reference.token_steps and meter.done


def test_a_stream_opening_with_an_error_event_is_told_by_its_first_piece() -> None:
    error = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
    assert leading_error(error + b"data: [DONE]\n\n") == {
        "message": "engine died",
        "type": "InternalServerError",
        "code": 500,
    }
    assert leading_error(error.replace(b"\n", b"\r\n"))  # any line ends
    assert server_error(leading_error(error) or {})
    client_side = error.replace(b"500", b"400")
    assert leading_error(client_side) and not server_error(leading_error(client_side) or {})
    assert leading_error(error[:40]) is None  # not whole in the first piece: relayed as it comes
    chunk = b'data: {"id":"cmpl-1","choices":[{"index":0,"text":"\\"error\\""}]}\n\n'
    assert leading_error(chunk) is None
    assert leading_error(b'data: {"id":"x","error":1}\n\n') is None  # not an error object


def test_without_usage_the_finishing_chunk_takes_the_fingerprint_but_not_the_usage_metrics() -> None:
    """vLLM sends its per-request ``metrics`` with the usage chunk only: a client that did not ask for
    usage does not get them on its finishing chunk (the system fingerprint it does)."""
    head = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    chunks = [
        {
            **head,
            "choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
            "usage": {"completion_tokens": 1},
        },
        {
            **head,
            "choices": [],
            "usage": {"completion_tokens": 1},
            "system_fingerprint": "fp",
            "metrics": {"speculative_decoding": {"num_spec_steps": 1}},
        },
    ]
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    meter = StreamMeter(0.0, keep_usage_chunk=False, keep_continuous=False)
    out = meter.feed(raw) + meter.flush()
    (finishing,) = [orjson.loads(e[6:]) for e in _events(out) if e != b"data: [DONE]"]
    assert finishing["system_fingerprint"] == "fp" and "metrics" not in finishing
    assert meter.spec_metrics == {"num_spec_steps": 1}  # read for the gateway's own measurement
