"""Feature extraction: the fast tokeniser gives exactly the tokens of the plain one."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st

from classifiers.features import _TOKEN, _tokens

FIXTURE = Path(__file__).parent / "fixtures" / "prompts-train.jsonl"


def _plain(text: str) -> list[str]:
    """The definition: every token, with digit-only tokens replaced by ``#``."""
    return ["#" if t.isdigit() else t for t in _TOKEN.findall(text)]


def test_fast_tokens_equal_the_plain_ones_on_real_prompts() -> None:
    texts = [orjson.loads(line)["prompt"] for line in FIXTURE.read_text().splitlines() if line.strip()]
    assert texts
    for text in texts:
        for variant in (text, text.lower()):
            assert _tokens(variant) == _plain(variant)


def test_fast_tokens_equal_the_plain_ones_on_edge_cases() -> None:
    cases = ["", "#", "12#34", "abc123def", "v1.2.3", "x_1 __init__"]
    cases += ["a\u00b2 \u00b2 12\u00b3", "\u0663\u0664 12"]  # superscripts; Arabic-Indic digits
    for text in cases:
        assert _tokens(text) == _plain(text), text


@given(st.text(alphabet=st.sampled_from("ab Z09_#.-\n\t\u00b2\u0663\u4e2d"), max_size=60))
def test_fast_tokens_equal_the_plain_ones_on_any_text(text: str) -> None:
    assert _tokens(text) == _plain(text)
