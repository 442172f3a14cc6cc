"""Feature extraction: the fast tokeniser gives exactly the tokens of the plain one; the head and tail
character windows hold every gram of the orders they are read at."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st

from classifiers.features import (
    _HT_ORDERS,
    _SEGMENT_END,
    _TOKEN,
    CHAR_HEAD,
    CHAR_TAIL,
    LAST_MAX,
    LAST_MIN_TEXT,
    _tokens,
    char_windows,
    extract,
    last_segment,
)
from classifiers.request import view

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


def _grams(text: str, orders: tuple[int, ...]) -> set[str]:
    """The definition: every substring of each order."""
    return {text[i : i + n] for n in orders for i in range(len(text) - n + 1)}


def test_head_and_tail_hold_every_gram_of_their_orders() -> None:
    # a long prompt: its head and tail windows differ, and the body between them is read apart
    text = "Summarise the report below in two lines:\n" + "lorem ipsum dolor " * 40 + "\nKey points only?"
    head, tail, _ = char_windows(text)
    f = extract(view({"prompt": text}))
    assert f.sparse["ch"] == _grams(head, _HT_ORDERS)
    assert f.sparse["ct"] == _grams(tail, _HT_ORDERS)
    assert len(head) <= CHAR_HEAD and len(tail) <= CHAR_TAIL


@given(st.text(alphabet=st.sampled_from("ab Z09.\n\u0e01\u0e32\u4e2d"), max_size=400))
def test_short_and_unsegmented_text_gives_character_grams(text: str) -> None:
    # scripts without spaces (Thai, Chinese) are read through the character grams of every order
    head, _, _ = char_windows(text)
    assert extract(view({"prompt": text})).sparse["ch"] == _grams(head, _HT_ORDERS)


PASSAGE = "The bakery opened at seven. Its windows fogged with steam and the smell of rye drifted down. " * 6


def test_the_question_after_a_passage_is_read_apart() -> None:
    f = extract(view({"prompt": PASSAGE + "\nWhen did the bakery open?"}))
    assert f.sparse["wl"] == {
        "when",
        "did",
        "the",
        "bakery",
        "open",
        "?",
        "when did",
        "did the",
        "the bakery",
        "bakery open",
        "open ?",
    }


def test_last_segment_is_the_last_sentence_of_a_long_line() -> None:
    assert last_segment(PASSAGE + "Copy the last sentence above.") == "Copy the last sentence above."
    # a CJK question mark ends the text: the segment is the question, not the empty piece after it
    assert last_segment(PASSAGE + "\u3002\u8fd9\u662f\u4ec0\u4e48\uff1f") == "\u8fd9\u662f\u4ec0\u4e48\uff1f"


def test_no_last_segment_without_a_pasted_body_or_when_it_is_passage() -> None:
    assert last_segment("When did the bakery open?") == ""
    assert extract(view({"prompt": "When did the bakery open?"})).sparse["wl"] == set()
    assert last_segment("word " * LAST_MAX + "end") == ""  # one long line with no sentence end is passage


def _plain_last(text: str) -> str:
    """The definition: the last non-empty piece of the whole window split at every segment end."""
    if len(text) <= LAST_MIN_TEXT:
        return ""
    pieces = _SEGMENT_END.split(text[-LAST_MAX - 1 :].rstrip())
    last = (pieces[-1] or pieces[-2] if len(pieces) > 1 else pieces[-1]).strip()
    return last if len(last) < LAST_MAX else ""


@given(st.text(alphabet=st.sampled_from("ab .?:\n\t\u3002\uff1f"), min_size=250, max_size=420))
def test_last_segment_reads_only_the_last_line_and_gives_the_plain_split(text: str) -> None:
    assert last_segment(text) == _plain_last(text)
