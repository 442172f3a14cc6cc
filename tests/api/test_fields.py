"""The JSON type of each known field, checked before a request goes anywhere."""

from __future__ import annotations

import orjson
import pytest

from classifiers.request import view
from gateway.api.errors import APIError
from gateway.api.fields import check_types
from gateway.routing.features import extract


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (b'{"prompt": "x", "max_tokens": "five"}', "max_tokens", "'max_tokens' must be an integer"),
        (b'{"prompt": "x", "max_tokens": "5.5"}', "max_tokens", "'max_tokens' must be an integer"),
        (b'{"prompt": "x", "temperature": "warm"}', "temperature", "'temperature' must be a number"),
        (b'{"prompt": "x", "stream": "2"}', "stream", "'stream' must be a boolean"),
        (b'{"prompt": "x", "seed": "18446744073709551616"}', "seed", "'seed' must be an integer"),
        (b'{"prompt": "x", "seed": 1.5}', "seed", "'seed' must be an integer"),
        # JSON integers past 64 bits come out of the parser as floats: the client sent an integer
        (b'{"prompt": "x", "seed": 18446744073709551616}', "seed", "'seed' is out of range"),
        (b'{"prompt": "x", "max_tokens": -9223372036854775809}', "max_tokens", "at most a 64-bit integer"),
        (
            b'{"prompt": "x", "stream_options": {"include_usage": 2}}',
            "stream_options.include_usage",
            "boolean",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_what_it_must_be(body: bytes, param: str, says: str) -> None:
    with pytest.raises(APIError) as e:
        check_types(orjson.loads(body), "completions")
    assert e.value.status == 400 and e.value.param == param and says in e.value.message


def test_integers_within_64_bits_are_integers() -> None:
    check_types(orjson.loads(b'{"prompt": "x", "seed": 9223372036854775807, "max_tokens": 1}'), "completions")
    check_types(orjson.loads(b'{"prompt": "x", "seed": -9223372036854775808}'), "completions")


def test_an_integer_written_as_a_whole_decimal_is_that_integer() -> None:
    payload = orjson.loads(b'{"prompt": "x", "max_tokens": 100.0, "n": 1.0, "seed": 1e2, "temperature": 1.0}')
    check_types(payload, "completions")
    assert payload == {"prompt": "x", "max_tokens": 100, "n": 1, "seed": 100, "temperature": 1.0}
    assert all(type(payload[k]) is int for k in ("max_tokens", "n", "seed"))
    assert type(payload["temperature"]) is float  # a number field stays as sent


def test_a_scalar_sent_as_a_string_is_read_as_vllm_reads_it() -> None:
    """vLLM's request models (pydantic, lax mode) read "0.5", "8" and "false" as a number, an integer
    and a boolean: the gateway serves them too, and routes on what vLLM will read (a stream of "true" is a
    stream)."""
    payload = orjson.loads(
        b'{"prompt": "x", "temperature": "0.5", "max_tokens": "8", "n": " 1 ", "stream": "true",'
        b' "echo": "no", "top_p": "1", "stream_options": {"include_usage": "yes"}}'
    )
    check_types(payload, "completions")
    assert payload == {
        "prompt": "x",
        "temperature": 0.5,
        "max_tokens": 8,
        "n": 1,
        "stream": True,
        "echo": False,
        "top_p": 1.0,
        "stream_options": {"include_usage": True},
    }
    assert type(payload["max_tokens"]) is int and type(payload["top_p"]) is float
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": "false", "top_logprobs": "2"}
    check_types(chat, "chat")
    assert chat["logprobs"] is False and chat["top_logprobs"] == 2
    with pytest.raises(APIError):  # a string field stays a string: a number is not read as one
        check_types({"prompt": "x", "user": 5}, "completions")
    # and 1 or 0 for a boolean, true for a number or an integer, as vLLM reads them
    ints = {"prompt": "x", "stream": 1, "echo": 0, "logprobs": True, "temperature": True, "max_tokens": False}
    check_types(ints, "completions")
    assert ints == {
        "prompt": "x",
        "stream": True,
        "echo": False,
        "logprobs": 1,
        "temperature": 1.0,
        "max_tokens": 0,
    }
    assert type(ints["logprobs"]) is int and type(ints["temperature"]) is float


def test_a_completion_may_give_its_prompt_as_embeddings_alone() -> None:
    check_types({"prompt_embeds": "AAAA"}, "completions")
    with pytest.raises(APIError):  # but a prompt that is given must be one
        check_types({"prompt": 5, "prompt_embeds": "AAAA"}, "completions")


class _Unread(list):  # type: ignore[type-arg]
    """An array that may be sliced but never walked whole: a prompt of a million token ids, a million
    stop strings (a 4 MB body), whose every item read cost the event loop 50-150 ms per request."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("walked a whole array")


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": _Unread([7] * 100_000)},
        {"model": "m", "prompt": _Unread([[7]] * 100_000)},
        {"model": "m", "prompt": _Unread(["text"] * 100_000)},
        {"model": "m", "prompt": "hi", "stop": _Unread(["\n"] * 100_000)},
    ],
)
def test_the_classifier_and_the_acceptance_features_read_the_head_of_long_arrays(
    body: dict[str, object],
) -> None:
    v = view(body)
    assert v.text in ("", "text", "hi") and v.stop_structured == ("stop" in body)
    assert extract(body, "other", 0.5).values


def test_a_long_prompt_of_token_ids_is_type_checked_by_its_head_the_upstream_judges_the_rest() -> None:
    check_types({"model": "m", "prompt": [7] * 100_000 + ["x"]}, "completions")
    check_types({"model": "m", "prompt": [[7]] * 100_000 + [["x"]]}, "completions")
    with pytest.raises(APIError) as e:
        check_types({"model": "m", "prompt": ["x", *[7] * 100_000]}, "completions")
    assert e.value.param == "prompt"
