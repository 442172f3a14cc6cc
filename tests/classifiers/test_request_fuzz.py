"""The trained classifier reads any request body without raising: it runs before the upstream sees it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from classifiers import load_default
from gateway.api.fields import FIELDS

CLASSIFIER = load_default()
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16,
)
field_names = st.sampled_from(sorted({*FIELDS["chat"], *FIELDS["completions"], "content", "role", "text"}))


@settings(max_examples=300, deadline=None, database=None)
@given(body=st.dictionaries(field_names | st.text(max_size=10), json_values, max_size=8))
def test_any_body_gives_a_prediction(body: dict[str, Any]) -> None:
    prediction = CLASSIFIER.predict(body)
    assert 0.0 <= prediction.p_structured <= 1.0
    assert prediction.label in ("structured", "open-ended")


message = st.dictionaries(
    st.sampled_from(["role", "content", "name", "text", "type"]), json_values, max_size=4
)


@settings(max_examples=300, deadline=None, database=None)
@given(messages=st.lists(message | json_values, max_size=6), prompt=json_values)
def test_any_messages_or_prompt_give_a_prediction(messages: list[Any], prompt: Any) -> None:
    for body in (
        {"messages": messages},
        {"prompt": prompt},
        {"messages": [{"role": "user", "content": prompt}]},
    ):
        assert CLASSIFIER.predict(body).label in ("structured", "open-ended")
