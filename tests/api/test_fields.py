"""The JSON type of each known field, checked before a request goes anywhere."""

from __future__ import annotations

import orjson
import pytest

from gateway.api.errors import APIError
from gateway.api.fields import check_types


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (b'{"prompt": "x", "max_tokens": "5"}', "max_tokens", "'max_tokens' must be an integer"),
        (b'{"prompt": "x", "seed": 1.5}', "seed", "'seed' must be an integer"),
        # JSON integers past 64 bits come out of the parser as floats: the client sent an integer
        (b'{"prompt": "x", "seed": 18446744073709551616}', "seed", "'seed' is out of range"),
        (b'{"prompt": "x", "max_tokens": -9223372036854775809}', "max_tokens", "at most a 64-bit integer"),
        (
            b'{"prompt": "x", "stream_options": {"include_usage": 1}}',
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


def test_a_completion_may_give_its_prompt_as_embeddings_alone() -> None:
    check_types({"prompt_embeds": "AAAA"}, "completions")
    with pytest.raises(APIError):  # but a prompt that is given must be one
        check_types({"prompt": 5, "prompt_embeds": "AAAA"}, "completions")
