"""Resuming a broken stream: the continuation request, and the splice, against scripted sockets.

The upstreams are raw asyncio servers on loopback that send chunked SSE and break on command (the
socket is aborted mid-event), so the gateway's real forwarding code sees a real reset.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.config import PoolName, load_settings
from gateway.errors import UpstreamError
from gateway.upstream.forward import Sent, Upstreams
from gateway.upstream.resume import Resumption, Transcript, refusal
from gateway.upstream.stream import StreamMeter, request_usage
from tests.upstream.scripted import read_request
from tests.upstream.wiring import upstreams_for

# -- the continuation request ------------------------------------------------------------------


def _transcript(*chunks: dict[str, Any]) -> Transcript:
    t = Transcript()
    for c in chunks:
        t.record(c)
    return t


def _cmpl(text: str, tokens: int, **choice: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-a",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": None, **choice}],
        "usage": {"prompt_tokens": 5, "total_tokens": 5 + tokens, "completion_tokens": tokens},
    }


def _chat(delta: dict[str, Any], tokens: int, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-a",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": {"prompt_tokens": 9, "total_tokens": 9 + tokens, "completion_tokens": tokens},
    }


def _body(chat: bool, payload: dict[str, Any], t: Transcript) -> dict[str, Any] | None:
    r = Resumption(chat, "/v1/chat/completions" if chat else "/v1/completions", payload, {}, t)
    body = r.body()
    return None if body is None else orjson.loads(body)


def test_completion_continues_from_prompt_plus_text_with_fewer_tokens() -> None:
    payload = {"model": "m", "prompt": "Once", "max_tokens": 20, "stream": True, "stop": ["\n\n"]}
    t = _transcript(_cmpl(" upon", 1), _cmpl(" a time", 3))
    body = _body(False, payload, t)
    assert body is not None
    assert body["prompt"] == "Once upon a time"
    assert body["max_tokens"] == 17 and body["stop"] == ["\n\n"]
    # the continuation's token counts are needed to sum usage, whatever the client asked
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert payload["prompt"] == "Once" and "stream_options" not in payload  # the original is untouched


def test_completion_without_max_tokens_keeps_vllms_default_budget() -> None:
    body = _body(False, {"model": "m", "prompt": ["Once"], "stream": True}, _transcript(_cmpl(" upon", 4)))
    assert body is not None and body["prompt"] == "Once upon" and body["max_tokens"] == 12


def test_completion_with_token_ids_continues_from_the_exact_ids() -> None:
    payload = {"model": "m", "prompt": "Once", "max_tokens": 8, "return_token_ids": True}
    t = _transcript(_cmpl(" up", 1, prompt_token_ids=[1, 44], token_ids=[70]), _cmpl("on", 2, token_ids=[71]))
    body = _body(False, payload, t)
    assert body is not None and body["prompt"] == [1, 44, 70, 71] and body["max_tokens"] == 6


def test_token_ids_of_a_long_stream_gather_in_order_and_leave_the_chunks_as_they_were() -> None:
    chunks = [_cmpl("x", i + 1, token_ids=[2 * i, 2 * i + 1]) for i in range(500)]
    chunks[0]["choices"][0]["prompt_token_ids"] = [9]
    t = _transcript(*chunks)
    assert t.token_ids == list(range(1000))
    # the transcript's list is its own: the chunks (which go on to the client) keep their ids
    assert [c["choices"][0]["token_ids"] for c in chunks[:2]] == [[0, 1], [2, 3]]
    body = _body(False, {"model": "m", "prompt": "Once", "max_tokens": 800}, t)
    assert body is not None and body["prompt"] == [9, *range(1000)] and body["max_tokens"] == 300


def test_a_prompt_of_ids_without_ids_in_the_stream_is_not_continued() -> None:
    assert refusal({"prompt": [1, 2, 3]}, chat=False) is None
    assert _body(False, {"prompt": [1, 2, 3], "max_tokens": 8}, _transcript(_cmpl("x", 1))) is None


def test_chat_continues_the_partial_assistant_message() -> None:
    messages = [{"role": "user", "content": "hi"}]
    payload = {"model": "m", "messages": messages, "max_completion_tokens": 30, "min_tokens": 2}
    t = _transcript(_chat({"role": "assistant", "content": ""}, 0), _chat({"content": "Hello th"}, 3))
    body = _body(True, payload, t)
    assert body is not None
    assert body["messages"] == [*messages, {"role": "assistant", "content": "Hello th"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 27 and body["min_tokens"] == 0


def test_chat_that_already_continues_a_message_appends_to_it() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]
    payload = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    body = _body(True, payload, _transcript(_chat({"content": " yes"}, 1)))
    assert body is not None and body["messages"][-1] == {"role": "assistant", "content": "Well, yes"}


def test_chat_broken_before_any_text_is_sent_again_as_it_was() -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    body = _body(True, payload, _transcript(_chat({"role": "assistant", "content": ""}, 0)))
    assert body is not None and body["messages"] == payload["messages"] and body["max_tokens"] == 5
    assert "continue_final_message" not in body


@pytest.mark.parametrize(
    ("chat", "extra"),
    [
        (False, {"n": 2}),
        (False, {"best_of": 3}),
        (False, {"logprobs": 0}),
        (False, {"echo": True}),
        (False, {"suffix": "end"}),
        (False, {"prompt": ["a", "b"]}),
        (True, {"logprobs": True}),
        (True, {"top_logprobs": 2}),
        (True, {"tool_choice": "required"}),
        (True, {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
        (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
        (True, {"response_format": {"type": "json_object"}}),
        (False, {"guided_json": {"type": "object"}}),
        (True, {"structured_outputs": {"regex": "a+"}}),
        # the upstream holds back text that could start one: the text sent ends inside a token
        (False, {"stop": "ent"}),
        (True, {"stop": [".", "\n\n"]}),
    ],
)
def test_requests_that_cannot_be_continued_exactly_are_refused(chat: bool, extra: dict[str, Any]) -> None:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    assert refusal(base, chat) is None
    assert refusal({**base, **extra}, chat) is not None


def test_one_character_stop_strings_hold_nothing_back_and_are_resumed() -> None:
    assert refusal({"prompt": "hi", "stop": ["\n", "."]}, chat=False) is None
    assert refusal({"prompt": "hi", "stop": "x"}, chat=False) is None


@pytest.mark.parametrize(
    "chunk",
    [
        _chat({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]}, 2),
        _chat({"reasoning": "first,"}, 2),
        _chat({"content": "done"}, 2, finish="stop"),
    ],
)
def test_streams_that_cannot_be_continued_are_refused(chunk: dict[str, Any]) -> None:
    t = _transcript(_chat({"role": "assistant", "content": ""}, 0), chunk)
    assert t.blocked is not None
    assert _body(True, {"messages": [{"role": "user", "content": "hi"}]}, t) is None


# -- the splice, over real sockets --------------------------------------------------------------


def _sse(obj: dict[str, Any] | str) -> bytes:
    return b"data: " + (obj.encode() if isinstance(obj, str) else orjson.dumps(obj)) + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class ScriptedSSE:
    """Sends ``events`` as a chunked SSE response, one by one; with ``break_after``, aborts the
    socket after that many, in the middle of the next event. ``status`` other than 200: a JSON body."""

    events: list[bytes]
    break_after: int | None = None
    stall_after: int | None = None  # then send nothing more, keeping the connection open
    status: int = 200
    bodies: list[dict[str, Any]] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            _, body = await read_request(reader)
            self.bodies.append(orjson.loads(body))
            if self.status != 200:
                body = b'{"error":{"message":"no","type":"InternalServerError","param":null,"code":500}}'
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (self.status, len(body), body)
                )
                await writer.drain()
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for i, event in enumerate(self.events):
                if i == self.stall_after:
                    await reader.read()  # until the gateway gives up and closes
                    return
                if i == self.break_after:
                    writer.write(_chunked(event[: len(event) // 2]))
                    await writer.drain()
                    writer.transport.abort()
                    return
                writer.write(_chunked(event))
                await writer.drain()
                await asyncio.sleep(0)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@asynccontextmanager
async def _pools(
    spec: ScriptedSSE, base: ScriptedSSE, attempts: int = 3, gap_s: float = 30.0
) -> AsyncIterator[Upstreams]:
    for s in (spec, base):
        s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    pools = {
        "speculative": {"endpoints": [{"name": "spec-0", "url": spec.url}], "models": ["m"]},
        "baseline": {"endpoints": [{"name": "base-0", "url": base.url}], "models": ["m"]},
    }
    overrides = {"pools": pools, "retries": {"attempts": attempts}, "timeouts": {"chunk_gap_s": gap_s}}
    settings = load_settings(overrides=overrides)
    try:
        async with upstreams_for(settings) as upstreams:
            yield upstreams
    finally:
        for s in (spec, base):
            assert s.server is not None
            s.server.close()
            await s.server.wait_closed()


def _chat_event(cid: str, delta: dict[str, Any], tokens: int, prompt: int, **extra: Any) -> bytes:
    finish = extra.pop("finish", None)
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + tokens, "completion_tokens": tokens}
    obj = {"id": cid, "object": "chat.completion.chunk", "created": 7 if cid == "a" else 99, "model": "m"}
    return _sse({**obj, "choices": [choice], "usage": usage, **extra})


FIRST = [
    _chat_event("a", {"role": "assistant", "content": ""}, 0, 9),
    _chat_event("a", {"content": "The sea"}, 2, 9),
    _chat_event("a", {"content": " is"}, 3, 9),
    _chat_event("a", {"content": " calm"}, 4, 9),  # cut in half: never reaches the client
]
# the continuation's counts start again from its own (longer) prompt
REST = [
    _chat_event("b", {"role": "assistant", "content": ""}, 0, 12),
    _chat_event("b", {"content": " calm"}, 1, 12),
    _chat_event("b", {"content": " tonight."}, 2, 12, finish="length"),
    _sse(
        {
            "id": "b",
            "object": "chat.completion.chunk",
            "created": 99,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 12, "total_tokens": 14, "completion_tokens": 2},
            "system_fingerprint": "fp-b",
        }
    ),
    _sse("[DONE]"),
]
PAYLOAD = {
    "model": "m",
    "messages": [{"role": "user", "content": "Describe the sea."}],
    "max_tokens": 5,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def _relay(
    upstreams: Upstreams,
    payload: dict[str, Any],
    chat: bool = True,
    pool: PoolName = "speculative",
    failover: bool = True,
) -> tuple[list[bytes], list[Any]]:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body, wants_usage, wants_continuous = request_usage(payload)
    meter = StreamMeter(0.0, keep_usage_chunk=wants_usage, keep_continuous=wants_continuous)
    resume = Resumption(chat, path, payload, {"content-type": "application/json"}, failover=failover)
    meter.transcript = resume.transcript
    sent = await upstreams.send(path, body, {}, pool, allow_failover=failover)
    done: list[Any] = []

    def on_done(s: Sent, failed: int | None) -> None:
        done.append((s.endpoint.name, failed, list(resume.endpoints)))

    pieces: list[bytes] = []
    try:
        async for piece in upstreams.relay(sent, meter, on_done, resume):
            pieces.append(piece)
    except UpstreamError as e:  # the API edge turns it into an error event
        pieces.append(b"raised " + type(e).__name__.encode() + b"\n\n")
    return [e for e in b"".join(pieces).split(b"\n\n") if e], done


def _resumptions(upstreams: Upstreams, outcome: str) -> float:
    labels = {"pool": "speculative", "outcome": outcome}
    return upstreams.metrics.registry.get_sample_value("specroute_stream_resumptions_total", labels) or 0.0


async def test_a_broken_chat_stream_is_spliced_into_one() -> None:
    spec, base = ScriptedSSE(FIRST, break_after=3), ScriptedSSE(REST)
    async with _pools(spec, base) as upstreams:
        events, done = await _relay(upstreams, PAYLOAD)
        assert _resumptions(upstreams, "resumed") == 1
    assert events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events[:-1]]
    assert {(c["id"], c["created"]) for c in chunks} == {("a", 7)}
    text = "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"])
    assert text == "The sea is calm tonight."
    assert sum("role" in ch["delta"] for c in chunks for ch in c["choices"]) == 1
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["length"]
    # usage only where the client asked (the last chunk), with its prompt and every token it got
    assert [c for c in chunks if "usage" in c] == [chunks[-1]]
    assert chunks[-1]["usage"] == {"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5}
    # the continuation: the sent text as an open assistant message, the budget less what was sent
    (sent_on,) = base.bodies
    assert sent_on["messages"][-1] == {"role": "assistant", "content": "The sea is"}
    assert sent_on["continue_final_message"] is True and sent_on["add_generation_prompt"] is False
    assert sent_on["max_tokens"] == 2
    assert done == [("base-0", None, ["base-0"])]


async def test_a_stream_only_its_own_pool_can_serve_is_resumed_in_that_pool_only() -> None:
    """A request the speculative pool refuses (min_p, logit_bias) broken on the baseline pool is not
    continued on the speculative one, which would answer the continuation with a 400."""
    for failover in (True, False):
        spec, base = ScriptedSSE(REST), ScriptedSSE(FIRST, break_after=3)
        async with _pools(spec, base) as upstreams:
            events, done = await _relay(upstreams, PAYLOAD, pool="baseline", failover=failover)
        if failover:
            assert len(spec.bodies) == 1 and events[-1] == b"data: [DONE]"
        else:
            assert spec.bodies == []
            assert events[-1].startswith(b"raised ")
            assert done == [("base-0", 502, [])]


async def test_without_attempts_left_the_stream_ends_with_an_error_event() -> None:
    spec, base = ScriptedSSE(FIRST, break_after=3), ScriptedSSE(REST)
    async with _pools(spec, base, attempts=1) as upstreams:
        events, done = await _relay(upstreams, PAYLOAD)
        assert _resumptions(upstreams, "refused") == 1
    assert base.bodies == []
    assert events[-1] == b"raised UpstreamBroken"
    assert b"calm" not in b"".join(events)  # the half event is dropped, not sent
    assert done == [("spec-0", 502, [])]


async def test_a_continuation_that_fails_ends_the_stream_with_an_error_event() -> None:
    spec, base = ScriptedSSE(FIRST, break_after=3), ScriptedSSE(REST, status=500)
    async with _pools(spec, base) as upstreams:
        events, done = await _relay(upstreams, PAYLOAD)
        assert _resumptions(upstreams, "failed") == 1
    assert len(base.bodies) == 1  # one endpoint left: tried once, the broken one never again
    assert events[-1] == b"raised UpstreamBroken" and b"data: [DONE]" not in events
    assert done == [("spec-0", 502, [])]


async def test_a_silent_stream_is_resumed_after_the_gap_timeout() -> None:
    spec, base = ScriptedSSE(FIRST, stall_after=3), ScriptedSSE(REST)
    async with _pools(spec, base, gap_s=0.2) as upstreams:
        events, done = await _relay(upstreams, PAYLOAD)
        timeouts = {"pool": "speculative", "endpoint": "spec-0", "kind": "timeout"}
        assert upstreams.metrics.registry.get_sample_value("specroute_upstream_errors_total", timeouts) == 1
        assert _resumptions(upstreams, "resumed") == 1
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events[:-1]]
    text = "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"])
    assert text == "The sea is calm tonight." and events[-1] == b"data: [DONE]"
    assert done == [("base-0", None, ["base-0"])]


def _cmpl_event(
    cid: str, text: str, ids: list[int], tokens: int, prompt_ids: list[int] | None, **kw: Any
) -> bytes:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": kw.get("finish"),
        "stop_reason": None,
        "prompt_token_ids": prompt_ids,
        "token_ids": ids,
    }
    prompt = len(prompt_ids or [0, 0])
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + tokens, "completion_tokens": tokens}
    obj = {"id": cid, "object": "text_completion", "created": 7 if cid == "a" else 99, "model": "m"}
    return _sse({**obj, "choices": [choice], "usage": usage})


def _token_id_streams() -> tuple[ScriptedSSE, ScriptedSSE]:
    """A completion with token ids that breaks after two events, and its continuation from the ids."""
    first = [
        _cmpl_event("a", " up", [70], 1, [1, 44]),
        _cmpl_event("a", "on", [71], 2, None),
        _cmpl_event("a", " a", [72], 3, None),
    ]
    rest = [
        _cmpl_event("b", " a", [72], 1, [1, 44, 70, 71]),
        _cmpl_event("b", " time", [73], 2, None, finish="length"),
        _sse("[DONE]"),
    ]
    return ScriptedSSE(first, break_after=2), ScriptedSSE(rest)


async def test_a_completion_with_token_ids_continues_from_the_ids() -> None:
    spec, base = _token_id_streams()
    payload = {"model": "m", "prompt": "Once", "max_tokens": 4, "stream": True, "return_token_ids": True}
    async with _pools(spec, base) as upstreams:
        events, _ = await _relay(upstreams, payload, chat=False)
    assert base.bodies[0]["prompt"] == [1, 44, 70, 71] and base.bodies[0]["max_tokens"] == 2
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " upon a time"
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == [70, 71, 72, 73]
    assert [c["choices"][0]["prompt_token_ids"] for c in chunks] == [[1, 44], None, None, None]
    assert not [c for c in chunks if "usage" in c]  # not asked for: stripped from both upstreams


async def test_ids_the_gateway_asked_for_resume_exactly_and_stay_hidden() -> None:
    spec, base = _token_id_streams()
    payload = {"model": "m", "prompt": "Once", "max_tokens": 4, "stream": True}
    resume = Resumption(False, "/v1/completions", payload, {})
    upstream = resume.upstream_payload(with_token_ids=True)
    assert upstream["return_token_ids"] is True and "return_token_ids" not in payload
    body, wants_usage, wants_continuous = request_usage(upstream)
    meter = StreamMeter(0.0, keep_usage_chunk=wants_usage, keep_continuous=wants_continuous)
    meter.transcript, meter.strip_token_ids = resume.transcript, resume.strip_token_ids
    async with _pools(spec, base) as upstreams:
        sent = await upstreams.send("/v1/completions", body, {}, "speculative")
        out = b"".join([p async for p in upstreams.relay(sent, meter, lambda s, f: None, resume)])
    assert spec.bodies[0]["return_token_ids"] is True
    assert base.bodies[0]["prompt"] == [1, 44, 70, 71] and base.bodies[0]["return_token_ids"] is True
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " upon a time"
    assert {(c["choices"][0]["prompt_token_ids"], c["choices"][0]["token_ids"]) for c in chunks} == {
        (None, None)
    }


def test_chat_and_clients_that_ask_for_ids_themselves_are_sent_as_they_are() -> None:
    chat = Resumption(True, "/v1/chat/completions", {"messages": []}, {})
    assert chat.upstream_payload(with_token_ids=True) is chat.payload and not chat.strip_token_ids
    own = Resumption(False, "/v1/completions", {"prompt": "x", "return_token_ids": True}, {})
    assert own.upstream_payload(with_token_ids=True) is own.payload and not own.strip_token_ids


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_the_splice_reads_any_line_ends(eol: bytes) -> None:
    transcript = Transcript(id="chatcmpl-first", created=1, model="m", role_sent=True)
    splice = Resumption(True, "/v1/chat/completions", {}, {}, transcript=transcript).splice()
    head = {"id": "chatcmpl-second", "created": 2, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "x"}}]},
    ]
    raw = b"".join(b"data:" + orjson.dumps(c) + eol * 2 for c in chunks) + b"data: [DONE]" + eol * 2
    out = b"".join(splice.feed(raw[i : i + 5]) for i in range(0, len(raw), 5))
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1].rstrip(b"\r\n") == b"data: [DONE]"
    (rest,) = [orjson.loads(e[6:]) for e in events[:-1]]  # the repeated role chunk is dropped
    assert rest["id"] == "chatcmpl-first" and rest["choices"][0]["delta"] == {"content": "x"}


def test_a_continuations_own_per_request_metrics_are_not_passed_as_the_whole_streams() -> None:
    """vLLM's per-request summary (speculative decoding's steps and drafts) on the continuation covers
    only its part, while the usage is summed: the client gets none rather than one at odds with it."""
    transcript = Transcript(id="cmpl-first", created=1, model="m")
    splice = Resumption(False, "/v1/completions", {}, {}, transcript=transcript).splice()
    spec = {"speculative_decoding": {"num_spec_steps": 3, "num_draft_tokens": 21}}
    last = {"id": "cmpl-second", "choices": [], "usage": {"completion_tokens": 5}, "metrics": spec}
    (event,) = [e for e in splice.feed(b"data: " + orjson.dumps(last) + b"\n\n").split(b"\n\n") if e]
    assert orjson.loads(event[6:])["metrics"] is None


@pytest.mark.parametrize(
    ("delta", "text", "role_sent", "blocked"),
    [
        ({"content": "ase"}, ["ase"], False, None),
        ({"role": "assistant", "content": ""}, [""], True, None),
        ({"content": None, "tool_calls": [{"index": 0}]}, [], False, "tool call in flight"),
        ({"reasoning_content": "hm"}, [], False, "reasoning in flight"),
        ({}, [], False, None),
    ],
)
def test_a_chat_delta_is_recorded_by_what_it_holds(
    delta: dict[str, Any], text: list[str], role_sent: bool, blocked: str | None
) -> None:
    transcript = Transcript()
    transcript.record({"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    assert (transcript.text, transcript.role_sent, transcript.blocked) == (text, role_sent, blocked)
