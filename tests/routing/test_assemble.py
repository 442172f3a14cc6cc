"""Non-streamed bodies assembled from a stream equal what vLLM returns non-streamed (real captures)."""

from __future__ import annotations

import orjson
import pytest

from gateway.upstream.assemble import assemble, can_assemble, stream_body

MODES = ["nospec", "ngram", "draftsame", "draftother"]


def _events(raw: bytes) -> list[dict]:
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: ") and e[6:] != b"[DONE]"]


def _same(assembled: dict, expected: dict, skip: tuple[str, ...] = ()) -> None:
    a, e = dict(assembled), dict(expected)
    for key in ("id", "created", *skip):
        a.pop(key)
        e.pop(key)
    assert a == e
    assert list(a) == list(e)  # vLLM's field order too


@pytest.mark.parametrize("mode", MODES)
def test_completion_from_greedy_stream(vllm_fixture, mode):
    expected = orjson.loads(vllm_fixture(f"{mode}_completion.json"))
    plain = assemble(_events(vllm_fixture(f"{mode}_completion_stream_greedy.sse")), "completions")
    _same(plain, expected, skip=("usage",))  # that capture was streamed without usage
    with_ids = _events(vllm_fixture(f"{mode}_completion_stream_greedy_tokenids.sse"))
    usage = assemble(with_ids, "completions")["usage"]
    assert usage == expected["usage"]


def test_completion_with_continuous_usage(vllm_fixture):
    expected = orjson.loads(vllm_fixture("nospec_completion.json"))
    _same(
        assemble(_events(vllm_fixture("nospec_completion_stream_greedy_usage.sse")), "completions"), expected
    )


@pytest.mark.parametrize("mode", MODES)
def test_chat_from_stream_with_usage(vllm_fixture, mode):
    expected = orjson.loads(vllm_fixture(f"{mode}_chat.json"))
    _same(assemble(_events(vllm_fixture(f"{mode}_chat_stream_usage.sse")), "chat"), expected)


def test_what_is_not_assembled():
    assert can_assemble({"prompt": "x", "max_tokens": 5}, "completions")
    assert can_assemble({"messages": [], "n": 1}, "chat")
    for extra in ({"n": 2}, {"logprobs": 1}, {"echo": True}, {"best_of": 2}, {"stream_options": {}}):
        assert not can_assemble({"prompt": "x", **extra}, "completions")
    assert not can_assemble({"prompt": ["a", "b"]}, "completions")
    assert not can_assemble({"messages": [], "tools": [{"type": "function"}]}, "chat")
    assert not can_assemble({"messages": [], "logprobs": True, "top_logprobs": 2}, "chat")
    # 0 asks for something too: the sampled tokens' log-probabilities, the prompt's
    for zero in ({"logprobs": 0}, {"prompt_logprobs": 0}, {"top_logprobs": 0}):
        assert not can_assemble({"prompt": "x", **zero}, "completions")
    assert can_assemble({"prompt": "x", "echo": False, "logprobs": None}, "completions")
    # vLLM refuses a streamed beam search ("Streaming is not currently supported with beam search")
    assert not can_assemble({"prompt": "x", "use_beam_search": True, "n": 1}, "completions")
    assert can_assemble({"prompt": "x", "use_beam_search": False}, "completions")
    body = orjson.loads(stream_body({"prompt": "x", "stream": False}))
    assert body["stream"] is True and body["stream_options"]["continuous_usage_stats"] is True


def test_empty_stream():
    assert assemble([], "chat") is None


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_the_chain_of_thought_keeps_the_name_the_stream_gave_it(key):
    """vLLM 0.32 streams and answers ``reasoning``; before 0.10 it was ``reasoning_content``, which a
    client of such a server reads from the message."""
    chunks = [
        {
            "id": "c",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", key: "th"}}],
        },
        {"choices": [{"index": 0, "delta": {key: "ink"}}]},
        {"choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]},
    ]
    message = assemble(chunks, "chat")["choices"][0]["message"]
    assert message[key] == "think" and message["content"] == "42"
    (other,) = {"reasoning", "reasoning_content"} - {key}
    assert other not in message


def test_an_answer_that_is_all_thinking_has_no_content():
    """vLLM's reasoning parser gives no content (``null``) when the output never left the chain of thought
    (cut by ``max_tokens``); an answer without thinking keeps its text, even an empty one."""
    thinking = [
        {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "Let me think"}, "finish_reason": "length"}]},
    ]
    message = assemble(thinking, "chat")["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == "Let me think"
    plain = [{**thinking[0]}, {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}]
    message = assemble(plain, "chat")["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning"] is None
