"""The acceptance model's C loops (``gateway/routing/_slots.c``) give what the Python definitions give."""

from __future__ import annotations

import copy
import math
from array import array
from itertools import pairwise
from zlib import crc32

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing import alpha_model, features
from gateway.routing.alpha_model import AlphaModel
from gateway.routing.features import MASK, WINDOW_WORDS, extract

_slots = pytest.importorskip("gateway.routing._slots", reason="built without the C extension")

# words, digits, marks, every kind of white space and letters outside ASCII, so that runs, single marks and
# separators all meet
_TEXT = st.text(
    st.one_of(
        st.sampled_from("abcxyz019_ "),
        st.sampled_from("\t\n\r\x0b\x0c\x1c\x85\xa0\u2003\u3000"),
        st.sampled_from(".,;:!?-\"'()[]{}#=/\\"),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=300,
)


def _python_slots(window: str, max_words: int = WINDOW_WORDS) -> tuple[int, ...]:
    """The word grams' slots by the Python definition (``features._grams`` on spaced text)."""
    words = features._WORD.findall(window)[:max_words]
    grams = words + list(map(" ".join, pairwise(words)))
    return tuple(crc32(("w=" + g).encode()) & MASK for g in grams)


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_word_slots_are_the_python_definitions(text: str) -> None:
    window = text.lower()
    assert _slots.word_slots(window, WINDOW_WORDS, MASK) == _python_slots(window)
    if features._spaced(window):  # where extract uses the C reader, it is ``_grams``' definition
        grams = features._grams(window)
        assert _python_slots(window) == tuple(crc32(("w=" + g).encode()) & MASK for g in grams)


@pytest.mark.parametrize(
    "window",
    [
        "",
        "   ",
        "convert this to json, please",
        "naïve café: 3 crème brûlée!",
        "x" * 500,
        " ".join(f"w{i}" for i in range(60)),
        "привет , как дела ?",
        "emoji 🙂 and \U0001d518 beyond the basic plane",
    ],
)
def test_word_slots_on_chosen_windows(window: str) -> None:
    assert _slots.word_slots(window, WINDOW_WORDS, MASK) == _python_slots(window)
    assert _slots.word_slots(window, 3, MASK) == _python_slots(window, 3)


def test_a_surrogate_is_left_to_the_python_definition() -> None:
    assert _slots.word_slots("a \ud800 b", WINDOW_WORDS, MASK) is None


def test_extract_without_the_c_reader_gives_the_same_features(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = [
        {"prompt": "Convert THIS to JSON, please", "temperature": 0.3},
        {"messages": [{"role": "user", "content": "Écris un poème sur la mer, s'il te plaît."}]},
        {"prompt": "请把下面的文字翻译成英文并保持格式"},
        {"prompt": "  "},
        {"prompt": ""},
    ]
    fast = [extract(b, "qa", 0.4) for b in bodies]
    monkeypatch.setattr(features, "_WORD_SLOTS", None)
    slow = [extract(b, "qa", 0.4) for b in bodies]
    assert fast == slow
    assert [x.names for x in fast] == [x.names for x in slow]
    for x in fast:
        assert x.slots == tuple(crc32(n.encode()) & MASK for n in x.names)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 63), st.floats(-3, 3, allow_nan=False)),
        min_size=1,
        max_size=40,
    ),
    st.floats(-5, 5, allow_nan=False),
)
def test_weighted_sums_are_the_loops(pairs: list[tuple[int, float]], start: float) -> None:
    mean = array("d", [math.sin(i) for i in range(64)])
    var = array("d", [1.0 + math.cos(i) for i in range(64)])
    stamp = array("d", [float(i) for i in range(64)])
    slots = tuple(s for s, _ in pairs)
    values = tuple(v for _, v in pairs)
    m, v, x2 = start, 0.0, 0.0
    for s, x in pairs:
        m += x * mean[s]
        v += x * x * var[s]
        x2 += x * x
    assert _slots.weighted(slots, values, mean, var, stamp, start, 100.0, 1000.0) == (m, v, x2)
    # a slot touched longer ago than the horizon: the caller refreshes first
    assert _slots.weighted(slots, values, mean, var, stamp, start, 100.0, 100.0 - min(slots) - 0.5) is None


def test_weighted_refuses_what_it_cannot_read() -> None:
    good = array("d", [0.0] * 4)
    with pytest.raises(IndexError):
        _slots.weighted((4,), (1.0,), good, good, good, 0.0, 0.0, 1.0)
    with pytest.raises(TypeError):
        _slots.weighted((0,), (1.0,), array("f", [0.0]), good, good, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError):
        _slots.weighted((0, 1), (1.0,), good, good, good, 0.0, 0.0, 1.0)


def test_the_prediction_is_the_same_with_and_without_the_c_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    model = AlphaModel(half_life_s=10.0, clock=lambda: clock[0])
    x = extract({"prompt": "List the files changed in this diff, one per line"}, "extraction", 0.7)
    for alpha in (0.9, 0.8, 0.85):
        model.observe(x, 0.7, alpha, 50)
    clock[0] += 300.0  # long enough that the slots' forgetting applies on the next prediction
    twin = copy.deepcopy(model)
    fast = model.predict(x, 0.7)
    monkeypatch.setattr(alpha_model, "_WEIGHTED", None)
    slow = twin.predict(x, 0.7)
    assert fast == slow
    assert model.var == twin.var and model.own_var == twin.own_var and model.stamp == twin.stamp
