"""The C gram counter (``classifiers/_grams.c``) against the Python sets it stands in for."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import classifiers.features as features_module
import classifiers.model as model_module
from classifiers.evaluate import load_probes
from classifiers.features import _HT_ORDERS, CHAR_ORDERS, _chars, _word_grams_py, extract
from classifiers.model import Classifier, load_default
from classifiers.request import view

GramTable = model_module.GRAM_TABLE
FIXTURE = Path(__file__).parent / "fixtures" / "prompts-train.jsonl"

needs_c = pytest.mark.skipif(GramTable is None, reason="classifiers._grams was not built")
word_grams = features_module.word_grams


def test_the_development_install_builds_the_c_counter() -> None:
    # the extension is optional for a wheel built without a compiler; where the tests run, one is there, and
    # a build that silently fell back would leave the classifier twice as slow
    assert GramTable is not None
    assert load_default()._char_plan is not None


def _python_score(table: dict[str, float], text: str, orders: tuple[int, ...]) -> tuple[float, int]:
    grams = _chars(text, orders)
    return sum(table.get(g, 0.0) for g in grams), len(grams)


# letters, digits, spaces and punctuation, accents, CJK, an emoji outside the BMP: every string width
_TEXT = st.text(alphabet="ab c.,0\nßéăş中文한😀\U0001f600", max_size=300)


@needs_c
@settings(max_examples=300, deadline=None)
@given(text=_TEXT, orders=st.sampled_from([(2, 3, 4), (3,), (1, 5), (2,)]))
def test_the_counter_gives_the_sets_sum_and_size(text: str, orders: tuple[int, ...]) -> None:
    weights = {g: (len(g) * 0.37 + ord(g[0]) % 7) - 2.5 for g in _chars(text[::2] + "ab c中😀", orders)}
    table = GramTable(weights)
    assert len(table) == len(weights)
    total, distinct = table.score(text, orders)
    expected_total, expected_distinct = _python_score(weights, text, orders)
    assert distinct == expected_distinct
    assert total == pytest.approx(expected_total, abs=1e-9)


@needs_c
def test_a_window_of_many_grams_and_grams_the_table_does_not_know() -> None:
    text = "".join(chr(0x4E00 + (i * 7919) % 5000) for i in range(3000))  # past the counter's stack slots
    weights = {text[i : i + 3]: 1.0 for i in range(0, 3000, 10)} | {"zzz": 5.0}
    total, distinct = GramTable(weights).score(text, (2, 3, 4))
    assert (total, distinct) == pytest.approx(_python_score(weights, text, (2, 3, 4)))


@needs_c
def test_bad_arguments_are_refused() -> None:
    table = GramTable({"ab": 1.0})
    assert table.score("", (2,)) == (0.0, 0)
    assert table.score("a", (2,)) == (0.0, 0)
    with pytest.raises(ValueError, match="between 1 and 16"):
        table.score("abc", (0,))
    with pytest.raises(TypeError):
        table.score(b"abc", (2,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be str"):
        GramTable({1: 1.0})  # type: ignore[dict-item]


def _bodies() -> list[dict[str, object]]:
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]
    bodies: list[dict[str, object]] = [{"prompt": r["prompt"]} for r in rows]
    bodies += [p.body for p in load_probes()]
    # a short prompt (one window for head and tail), one between the windows, one with a system prompt
    bodies += [
        {"prompt": "Count from 1 to 20."},
        {"prompt": "x" * 130 + " repeat the lines below " + "y" * 20},
        {"messages": [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Hi"}]},
    ]
    return bodies


@needs_c
def test_the_classifier_scores_the_same_either_way() -> None:
    clf = load_default()
    bodies = _bodies()
    assert len(bodies) > 300
    for body in bodies:
        v = view(body)  # type: ignore[arg-type]
        with_sets = clf.score(extract(v, clf.used))
        counted = extract(v, clf.used, char_grams=False)
        assert counted.chars is not None and not any(counted.sparse[ns] for ns in CHAR_ORDERS)
        assert clf.score(counted) == pytest.approx(with_sets, abs=1e-9)
        hashed = extract(v, clf.used, char_grams=False, hashed_words=True)
        assert clf.score(hashed) == pytest.approx(with_sets, abs=1e-9)
        assert list(hashed.dense.items()) == list(counted.dense.items())


def test_without_the_c_counter_the_classifier_counts_with_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "GRAM_TABLE", None)
    shipped = load_default()
    plain = Classifier(
        bias=shipped.bias,
        sparse=shipped.sparse,
        dense=shipped.dense,
        threshold=shipped.threshold,
        calibration=shipped.calibration,
    )
    assert plain._char_plan is None
    for body in _bodies()[:100]:
        assert plain.predict(body).p_structured == pytest.approx(shipped.predict(body).p_structured, abs=1e-9)  # type: ignore[arg-type]


@needs_c
def test_a_table_whose_grams_share_a_hash_leaves_the_sets_in_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(weights: dict[str, float]) -> None:
        raise ValueError("two grams share a hash")

    monkeypatch.setattr(model_module, "GRAM_TABLE", refuse)
    shipped = load_default()
    clf = Classifier(bias=shipped.bias, sparse=shipped.sparse, dense=shipped.dense)
    assert clf._char_plan is None and clf._word_plan is None
    body = {"prompt": "Copy the third line of the text below exactly.\n\none\ntwo\nthree"}
    assert clf.predict(body).p_structured == pytest.approx(
        1.0 / (1.0 + math.exp(-clf.score(extract(view(body), clf.used)))), abs=1e-12
    )


def test_the_head_and_tail_orders_are_the_ones_the_counter_is_given() -> None:
    assert CHAR_ORDERS["ch"] == CHAR_ORDERS["ct"] == _HT_ORDERS


def test_the_development_install_reads_words_in_c() -> None:
    assert GramTable is not None and word_grams is not _word_grams_py


# each character class of the tokens, in and outside ASCII: letters, digits (ASCII, Arabic-Indic, full-width),
# superscripts (digits to str.isdigit, letters to the regex), "_", white space and the \x1c-\x1f separators,
# marks, a combining accent, CJK and Hangul (word characters left out), the katakana long-vowel mark, a
# dotted capital whose lower case is two characters, an emoji outside the BMP, a lone surrogate
_WORD_TEXT = st.text(alphabet="aZ é0 9#_,.-\t\n\x1c\x1f²³٣\uff14中한ー・\u0301İß😀\ud800:=", max_size=200)


@needs_c
@settings(max_examples=500, deadline=None)
@given(text=_WORD_TEXT)
def test_the_word_reader_gives_the_regex_tokens_and_grams(text: str) -> None:
    assert word_grams(text) == _word_grams_py(text)


@needs_c
@pytest.mark.sweep  # about 30 s in all: run by `make test-timing`
@pytest.mark.parametrize("between", ["", " ", "a", "1", "²"])
def test_the_word_reader_classes_every_code_point_as_the_regex_does(between: str) -> None:
    # every code point once, run together or set apart: a character put in another class than the regex's
    # changes the runs and so the tokens
    text = between.join(map(chr, range(0x110000)))
    tokens, grams = word_grams(text)
    expected_tokens, expected_grams = _word_grams_py(text)
    assert tokens == expected_tokens
    assert grams == expected_grams


@needs_c
def test_features_are_the_same_with_either_word_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    clf = load_default()
    bodies = _bodies()
    fast = [extract(view(b), clf.used) for b in bodies]  # type: ignore[arg-type]
    monkeypatch.setattr(features_module, "word_grams", _word_grams_py)
    plain = [extract(view(b), clf.used) for b in bodies]  # type: ignore[arg-type]
    assert [f.sparse for f in fast] == [f.sparse for f in plain]
    assert [f.dense for f in fast] == [f.dense for f in plain]


@needs_c
def test_the_word_reader_refuses_what_is_not_text() -> None:
    assert word_grams("") == ([], set())
    with pytest.raises(TypeError):
        word_grams(b"abc")  # type: ignore[arg-type]


def test_without_the_extension_the_words_are_read_by_the_regexes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "classifiers._grams", None)  # what an install without a compiler has
    assert features_module._c_word_grams() is _word_grams_py


# --- words read as hashes (``word_hashes``, ``GramTable.sum`` and ``.bits``) ---

HASHED = features_module.HASHED
needs_hashed = pytest.mark.skipif(HASHED is None, reason="classifiers._grams was not built")


@needs_hashed
@settings(max_examples=400, deadline=None)
@given(text=_WORD_TEXT)
def test_hashed_words_count_what_the_sets_hold(text: str) -> None:
    assert HASHED is not None
    tokens, grams = _word_grams_py(text)
    packed, n_tokens, marks, first = HASHED.read(text, True)
    assert (n_tokens, marks) == (len(tokens), tokens.count("#"))
    assert list(first) == [t for t in tokens[:6] if t.isalpha()][:2]
    assert len(packed) == 8 * len(grams)  # each distinct gram once
    # a table of every gram, each weighing its own power of two: the sum names exactly the grams read
    weights = {g: float(2**i) for i, g in enumerate(sorted(grams)[:40])}
    if weights:
        assert GramTable(weights).sum(packed) == sum(weights.values())
        assert GramTable(weights).bits(packed) == int(sum(weights.values()))
    unigrams, *_ = HASHED.read(text, False)
    assert len(unigrams) == 8 * len(set(tokens))


@needs_hashed
@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab Q:=-*1²,;|?\n.)_#éwrite a poem json code list"), max_size=700)
)
def test_hashed_features_score_as_the_sets_do(text: str) -> None:
    clf = load_default()
    for body in (
        {"prompt": text},
        {"messages": [{"role": "system", "content": text[:50]}, {"role": "user", "content": text}]},
    ):
        v = view(body)
        hashed = extract(v, clf.used, char_grams=False, hashed_words=True)
        plain = extract(v, clf.used, char_grams=False)
        assert hashed.words is not None and plain.words is None
        assert list(hashed.dense.items()) == list(plain.dense.items())
        assert hashed.sparse["f"] == plain.sparse["f"]
        assert clf.score(hashed) == pytest.approx(clf.score(plain), abs=1e-9)


@needs_hashed
def test_the_lexicons_answer_as_the_sets_do() -> None:
    assert HASHED is not None
    lexicons = [lex for _, lex in features_module._CUE_KEYS]
    # every lexicon entry as a text of its own, and all of them in one (CJK words are matched as character
    # pairs, by the sets: see below)
    entries = sorted({g for lex in lexicons for g in lex if not features_module._FROM_KANA.search(g)})
    for text in [*entries, " ".join(entries), "Please write a poem, then give me the json config."]:
        grams = _word_grams_py(text.lower())[1]
        expected = sum(1 << i for i, lex in enumerate(lexicons) if not grams.isdisjoint(lex))
        packed, *_ = HASHED.read(text.lower(), True)
        assert HASHED.cues.bits(packed) == expected, text
        assert HASHED.code.sum(packed) == len(grams & features_module.CODE_KEYWORDS), text
    assert HASHED.code.sum(HASHED.read("def f ( ) : return none", True)[0]) == 3.0


@needs_hashed
def test_text_with_cjk_keeps_the_sets() -> None:
    # CJK cues read character pairs, which the hashed reader does not: such a window takes the sets
    f = extract(view({"prompt": "写一首关于秋天的诗 in the style of Li Bai"}), hashed_words=True)
    assert f.words is None and "li bai" in f.sparse["wh"] and f.dense["cue_creative"] == 1.0


def test_without_the_hashed_reader_the_classifier_reads_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "HASHED", None)
    shipped = load_default()
    plain = Classifier(
        bias=shipped.bias, sparse=shipped.sparse, dense=shipped.dense, calibration=shipped.calibration
    )
    assert plain._word_plan is None
    for body in _bodies()[:100]:
        assert plain.predict(body).p_structured == pytest.approx(shipped.predict(body).p_structured, abs=1e-9)  # type: ignore[arg-type]


@needs_hashed
def test_packed_hashes_are_checked() -> None:
    assert HASHED is not None
    table = GramTable({"ab": 1.0})
    assert table.sum(b"") == 0.0 and table.bits(b"") == 0
    with pytest.raises(TypeError):
        table.sum(b"abc")
    with pytest.raises(TypeError):
        table.bits("abcdefgh")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        HASHED.read(b"abc", True)  # type: ignore[arg-type]
