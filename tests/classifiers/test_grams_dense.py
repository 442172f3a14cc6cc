# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""The structural cues, their weighted sum and the character windows' normal form in C
(``classifiers/_grams.c``: ``DenseReader``, ``weighted_sum``, ``norm``) against the Python definitions they
stand in for (``features._dense``, ``sum`` over the products, ``features._norm_py``): the same dict, key
for key and float for float, the same text, and so the same prediction for every prompt. Equality is exact
(``==`` on each float's bits), not approximate: a difference in the last bit fails."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from itertools import repeat
from operator import mul
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import classifiers.features as F
import classifiers.model as M
from classifiers.features import DENSE_READ, extract
from classifiers.model import Classifier, Prediction, load_default
from classifiers.request import RequestView, view

needs_c = pytest.mark.skipif(
    DENSE_READ is None or M.WEIGHTED_SUM is None, reason="classifiers._grams was not built"
)

PASSAGE = (
    "The harbour froze in the winter of 1709. Fishermen walked to the island, 3 km out, and back.\n"
    "name: Ada\nage = 36\n  key.sub[0] : value\n- one\n* two\n• three\n12. twelve\n1234. not a bullet\n"
    "user: hi there\nAssistant : hello\nQ: why?\nA: because\n| a | b | c |\nx,y,z\na\tb\tc\n"
    '```\ndef f(x):\n    return {"k": x}\n```\n\tindented\n   three spaces\n\n\nnext paragraph\n'
)
JSON = '{"name": "Ada", "tags": ["a", "b"], "nested": {"x": 1.5, "y": -2}, \'single\': true}'
CODE = (
    "import os\n\nclass A:\n    def run(self) -> int:\n        return [i for i in range(10) if i % 2 == 0]\n"
)


def _prompts() -> list[str]:
    """Prompts written for these tests: every script, shape and edge the cues read."""
    r = random.Random(7)
    words = [
        "copy",
        "repeat",
        "json",
        "yaml",
        "the",
        "of",
        "list",
        "write",
        "poem",
        "why",
        "how",
        *"123,;:=-*?\n",
    ]
    noise = ["".join(r.choice(words) + " " for _ in range(n)) for n in (40, 300, 1500)]
    return [
        "",
        " ",
        "\n",
        " \n\t \x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u2028\u3000",
        "?",
        "hi",
        "Write one sentence about benchmarking proxies.",
        "List 1, 2, 3, 5, 8, 13 and continue the sequence?",
        "1.5; 2.25 ;-3, 4.0,5 then stop",
        "1.2.3, 4, 5, 6",
        "1, 2, 3",
        "٣, ٤, ٥, ٦ and ４, ５, ６, ７",
        "count: 10,20,30,40 and 1 , 2 , 3 , 4",
        "Summarise: " + "a" * 140,
        "Translate this paragraph into French, keeping every name as it is: " + "b " * 60,
        "上司が非倫理的なことをするよう頼んだらどうしますか?",
        "请把下面的文字翻译成英文：今天天气很好，我们去公园散步吧。" * 3,
        "用户：你好\n助手：你好！\n用户：讲个笑话",
        "안녕하세요, 오늘 날씨가 어때요? 표로 정리해 주세요.",
        "Bitte fasse den Text zusammen: Über die Brücke gingen ²³ Leute.",
        "¿Puedes escribir un poema sobre el mar? Que tenga tres estrofas.",
        "Напишите функцию на Python, которая сортирует список: [3, 1, 2]",
        "اكتب قصة قصيرة عن البحر؟",
        "क्या आप मुझे एक कविता लिख सकते हैं।",
        "Τι είναι η φωτοσύνθεση;",
        "ΑΣ ΣΑ σς " * 30,
        "x² + y² = z²; solve for z when x = 3 and y = 4",
        "Emoji 😀🎉 and math 𝔸𝔹ℂ and a flag 🇫🇷 in a long line " * 10,
        "\x00\x01\x02 control \x07\x08 chars\x7f and \x1b[31mansi\x1b[0m",
        "HUMAN: hi\nİser: x\nıi: x\nſystem: y\nAİ: z\nBOT ：z\n  q:\nyou :\nme:\ncustomer: c\nagent= no",
        "ai:\nAi:\nai :\naix:\nassistant:\nasSIstant :\n用户 ：x\n助手:",
        PASSAGE,
        PASSAGE * 8 + "\nWho walked to the island, and when?",
        "Copy lines 2-4 from the text below:\n" + PASSAGE * 5,
        "Copy lines 2-4 from the text below：\n" + PASSAGE * 5 + "\n那么，谁去了岛上？",
        PASSAGE * 3 + "\n" + "x" * 301,
        PASSAGE * 3 + "\nक्या आप बता सकते हैं।",
        PASSAGE * 3 + "\nΤι είναι;  \n\n\t ",
        "first line:\n" + "body " * 200 + "\n   \n" + " " * 100,
        "a\n" * 400,
        "same line\n" * 50 + "other\n" * 20,
        "\n\n\n\n" + "x\n\n" * 30,
        "a" * 5000,
        "a" * 100 + "\n" + "b" * 100 + "\n" + "c" * 100,
        JSON,
        JSON * 20,
        CODE,
        CODE * 12 + "\nFix the bug above.",
        '<html><body><div class="x">${a} | $b | `c` \\ (d) [e] {f} = g</div></body></html>',
        "- " * 300,
        "-" * 41 + ": x\n" + "k" * 40 + ": x\n" + "k" * 41 + ": x",
        *noise,
        "\t" * 600 + "?",
        "What?" + " " * 200,
        "x" * 200 + "\n" + "y" * 200 + "？",
    ]


def _bodies() -> Iterator[dict[str, Any]]:
    for prompt in _prompts():
        yield {"prompt": prompt}
    yield {"prompt": PASSAGE, "tools": [{"type": "function"}]}
    yield {"prompt": JSON, "response_format": {"type": "json_object"}, "temperature": 0.1, "max_tokens": 10}
    yield {
        "messages": [
            {"role": "system", "content": "Answer only from the documents below.\n" + PASSAGE},
            {"role": "user", "content": "Who walked to the island?"},
        ],
        "temperature": 0.2,
    }
    yield {
        "messages": [
            {"role": "system", "content": "You are a pirate. Stay in character. Reply in JSON."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Arr!"},
            {"role": "user", "content": "Tell me about your ship. " * 20},
        ]
    }
    yield {"messages": [{"role": "user", "content": [{"type": "text", "text": "用户：写一首诗"}]}]}
    yield {"messages": [{"role": "assistant", "content": "alone"}]}


def _c_and_python(body: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """What the classifier gives for ``body`` with the C pieces and with the Python definitions."""
    clf = load_default()
    v = view(body)
    c = (clf.predict(body), _features(v, clf))
    with monkeypatch.context() as m:
        m.setattr(F, "DENSE_READ", None)
        m.setattr(F, "_norm", F._norm_py)
        m.setattr(clf, "_weighted_sum", None)
        m.setattr(clf, "_scorer", None)
        python = (clf.predict(body), _features(v, clf))
    return c, python


def _features(v: RequestView, clf: Classifier) -> Any:
    out = []
    for hashed in (False, True):
        try:
            f = extract(v, clf.used, char_grams=False, hashed_words=hashed)
        except Exception as e:  # a lone surrogate: the same error either way
            out.append(type(e))
        else:
            out.append([(k, x.hex()) for k, x in f.dense.items()])
            out.append(f.chars)
            out.append(clf.score(f).hex())
    return out


def _same(a: Prediction, b: Prediction) -> bool:
    return (a.p_structured.hex(), a.label, a.kind) == (b.p_structured.hex(), b.label, b.kind)


@needs_c
def test_the_development_install_builds_the_dense_reader() -> None:
    assert F.DENSE_READ is not None and M.WEIGHTED_SUM is not None and F._norm is not F._norm_py
    assert load_default()._weighted_sum is M.WEIGHTED_SUM


@needs_c
def test_every_prompt_gets_the_same_cues_score_and_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = list(_bodies())
    assert len(bodies) > 60
    for body in bodies:
        (c_pred, c_feats), (py_pred, py_feats) = _c_and_python(body, monkeypatch)
        assert c_feats == py_feats, body
        assert _same(c_pred, py_pred), body


@needs_c
def test_a_lone_surrogate_fails_as_the_python_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # a JSON body may carry one ("\ud800"): ``str.encode`` refuses it, and the prediction is the neutral one
    body = {"prompt": "copy this \ud800 line: 1, 2, 3, 4"}
    (c_pred, c_feats), (py_pred, py_feats) = _c_and_python(body, monkeypatch)
    assert c_feats == py_feats == [UnicodeEncodeError, UnicodeEncodeError]
    assert _same(c_pred, py_pred) and c_pred == M.NEUTRAL


def _both(
    text: str,
    scanned: str | None = None,
    context: str = "",
    turns: int = 1,
    counts: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """The C reader and ``_dense`` on the same inputs; ``scanned`` may be any text, longer than a window.
    ``counts`` (tokens, ``#`` tokens) stand for the window's words where given."""
    assert DENSE_READ is not None
    scanned = F.window(text) if scanned is None else scanned
    if counts is None:
        tokens = F._word_grams_py(scanned.lower())[0]
        counts = len(tokens), tokens.count("#")
    n_tokens, hashes = counts
    cues = tuple(float(i % 2) for i in range(len(F._CUE_KEYS)))
    ctx_cues = tuple(float(i % 3 == 0) for i in range(len(F._CONTEXT_KEYS))) if context else None
    v = RequestView(text, context, turns, bool(context), 0.0, False, False, None, False, None)
    try:
        py = [
            (k, x.hex()) for k, x in F._dense(text, scanned, n_tokens, hashes, 3, cues, ctx_cues, v).items()
        ]
    except Exception as e:
        py = type(e)  # type: ignore[assignment]
    try:
        read = DENSE_READ(
            text, scanned, n_tokens, hashes, 3, cues, ctx_cues, turns, bool(context), len(context)
        )
        c = [(k, x.hex()) for k, x in read.items()]
    except Exception as e:
        c = type(e)  # type: ignore[assignment]
    return c, py


# the characters the cues' regexes and counts turn on: white space of every kind, separators, marks, digits
# of other scripts, letters that match a speaker's under IGNORECASE (dotless i, long s, dotted capital I,
# Kelvin sign), CJK colons and question marks, the speaker words' letters
_CUE_TEXT = st.lists(
    st.sampled_from(
        [
            *" \t\n\r\x0b\x0c\x1c\x85\xa0\u3000:=-*•.)[]_,;|\"'`{}$\\?？：؟;।",
            *"01239٣４²aAbcdeghimnoqrstuyIıİſK",
            *("user", "assistant", "ai", "用户", "助手", "```", "\n    ", "\n\t", "\n\n", '":', "  ", "   "),
        ]
    ),
    max_size=500,
).map("".join)


@needs_c
@settings(max_examples=600, deadline=None)
@given(text=_CUE_TEXT, context=st.sampled_from(["", "system prompt"]), turns=st.integers(0, 5))
def test_the_reader_gives_the_python_cues(text: str, context: str, turns: int) -> None:
    c, py = _both(text, context=context, turns=turns)
    assert c == py


@needs_c
@settings(max_examples=200, deadline=None)
@given(text=_CUE_TEXT)
def test_the_reader_gives_the_python_cues_on_a_window_of_any_size(text: str) -> None:
    # the matchers and the line table past their stack sizes: the whole text as the window
    c, py = _both(text * 3, scanned=text * 3)
    assert c == py


def _lines_of_each(template: str, points: list[str], chunk: int = 4096) -> Iterator[str]:
    """Texts of one line a code point, the code point put into ``template`` at ``{}``: a character classed
    apart from the regex's changes the number of lines that match."""
    for start in range(0, len(points), chunk):
        yield "\n".join(template.format(c) for c in points[start : start + chunk])


_EVERY = [chr(i) for i in range(0x110000) if not 0xD800 <= i <= 0xDFFF and i != 0x0A]
# the code points a speaker's letter can match under IGNORECASE: a character that neither lower nor upper
# case changes is matched by itself only (its simple lower case is itself), so ASCII and white space stand
# for all of those
_CASED = [c for c in _EVERY if c.isascii() or c.isspace() or c.lower() != c or c.upper() != c]


@needs_c
@pytest.mark.parametrize(
    "template",
    [
        "{}: x",  # the key's class [-\w.\[\]]
        "a{}= x",  # white space between key and separator
        "a:{}x",  # white space after the separator, or the \S that ends the match
        "{}1. x",  # leading white space or a digit of the number
        "-{}x",  # the white space a bullet needs
    ],
)
def test_the_matchers_class_every_code_point_as_the_regexes_do(template: str) -> None:
    for text in _lines_of_each(template, _EVERY):
        c, py = _both(text, scanned=text, counts=(1, 1))
        assert c == py, template


@needs_c
@pytest.mark.parametrize(
    "template",
    [
        *("{}i:", "a{}:", "{}:", "yo{}:", "user{}:", "use{}:", "b{}t:", "{}ot:", "{}ustomer:", "a{}ent:"),
        *("{}ystem:", "s{}stem:", "sy{}tem:", "sys{}em:", "syst{}m:", "syste{}:"),
        *("{}uman:", "h{}man:", "hum{}n:", "huma{}:"),
    ],
)
def test_the_speakers_match_letters_in_any_case_as_the_regex_does(template: str) -> None:
    for text in _lines_of_each(template, _CASED):
        c, py = _both(text, scanned=text, counts=(1, 1))
        assert c == py, template


@needs_c
def test_the_number_sequence_reads_every_digit_and_space_as_the_regex_does() -> None:
    candidates = [
        chr(i)
        for i in range(0x110000)
        if not 0xD800 <= i <= 0xDFFF and (chr(i).isdigit() or chr(i).isnumeric() or chr(i).isspace())
    ]
    for c in candidates:
        for text in (f"{c}, 1, 2, 3 go", f"1,{c}2, 3, 4 go", f"1, 2, 3,-{c} go", f"1.{c}, 2, 3, 4 go"):
            c_cues, py_cues = _both(text)
            assert c_cues == py_cues, text


@needs_c
def test_the_reader_refuses_what_the_python_refuses() -> None:
    assert DENSE_READ is not None
    with pytest.raises(TypeError):
        DENSE_READ(b"x", "x", 0, 0, 0, (), None, 1, False, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cue values"):
        DENSE_READ("x", "x", 0, 0, 0, (1.0,), None, 1, False, 0)
    # a view of no messages: math.log1p(-1) refuses, so does the reader
    assert _both("x", turns=0) == (ValueError, ValueError)
    from classifiers._grams import DenseReader

    with pytest.raises(ValueError, match="base"):
        DenseReader(("a",), F.DENSE_LAYOUT, (), ())


def _python_sum(weights: dict[str, Any], values: dict[str, Any]) -> Any:
    return sum(map(mul, map(weights.get, values, repeat(0.0, len(values))), values.values()))


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    values=st.dictionaries(st.sampled_from("abcdefghijklmnopqrstuvwxyz"), st.floats(-1e6, 1e6), max_size=40),
    weights=st.dictionaries(st.sampled_from("abcdefghijklmnopqrstuvwxyz"), st.floats(-50, 50), max_size=40),
)
def test_the_weighted_sum_adds_as_sum_does(values: dict[str, float], weights: dict[str, float]) -> None:
    assert M.WEIGHTED_SUM is not None
    assert M.WEIGHTED_SUM(weights, values).hex() == float(_python_sum(weights, values)).hex()


@needs_c
def test_the_weighted_sum_refuses_what_is_not_a_float() -> None:
    assert M.WEIGHTED_SUM is not None
    with pytest.raises(TypeError):
        M.WEIGHTED_SUM({"a": 1}, {"a": 1.0})
    with pytest.raises(TypeError):
        M.WEIGHTED_SUM({"a": 1.0}, {"a": 1})
    assert M.WEIGHTED_SUM({"b": 1}, {"a": 2.0}) == 0.0  # a weight that is not read is not checked
    # a model with a weight that is not a float scores through Python's arithmetic
    shipped = load_default()
    key = "lines"
    clf = Classifier(bias=shipped.bias, sparse=shipped.sparse, dense={**shipped.dense, key: 1})
    assert clf._weighted_sum is None
    f = extract(
        view({"prompt": "Copy this line.\nAnd this one."}), clf.used, char_grams=False, hashed_words=True
    )
    expected = shipped.score(f) + f.dense[key] * (1 - shipped.dense.get(key, 0.0))
    assert f.dense[key] and clf.score(f) == pytest.approx(expected, abs=1e-12)


def test_without_the_extension_the_python_computes_the_cues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "classifiers._grams", None)  # what an install without a compiler has
    assert F._c_dense() is None and M._c_weighted_sum() is None and F._c_norm() is F._norm_py
    monkeypatch.setattr(F, "DENSE_READ", None)
    f = extract(view({"prompt": "name: Ada\n- one\n- two"}))
    assert list(f.dense)[: len(F.DENSE_BASE)] == list(F.DENSE_BASE)


# --- the windows' normal form (``norm``) ---


def _same_text(a: str, b: str) -> bool:
    """Equal (which compares the storage width too), and held in the form a fresh copy takes: a str
    outside its narrowest form, or ASCII not flagged as such, would compare wrongly elsewhere.

    Against a fresh copy rather than ``b``: the size of a str counts its cached UTF-8 form, which a
    one-character str (a shared object) may carry from anywhere else in the process."""
    if a != b:
        return False
    if len(a) > 1:
        return sys.getsizeof(a) == sys.getsizeof("".join([a[:1], a[1:]]))
    return a.isascii() == all(ord(c) < 128 for c in a)


@needs_c
@pytest.mark.parametrize("between", ["", " ", "A1", "\u3000", "\u0130"])
def test_norm_reads_every_code_point_as_the_python_does(between: str) -> None:
    points = [chr(i) for i in range(0x110000) if not 0xD800 <= i <= 0xDFFF]
    for start in range(0, len(points), 1024):
        text = between.join(points[start : start + 1024])
        assert _same_text(F._norm(text), F._norm_py(text)), start
    for c in points[:0x3000]:  # alone: a text of one character, its own width
        assert _same_text(F._norm(c), F._norm_py(c)), hex(ord(c))


@needs_c
@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet="aZ 09\t\n\x1c\x85\xa0\u3000é²٣İΣσẞﬃ中😀\ud800\x00", max_size=200))
def test_norm_gives_the_python_text(text: str) -> None:
    assert _same_text(F._norm(text), F._norm_py(text))


@needs_c
def test_norm_refuses_what_is_not_text() -> None:
    with pytest.raises(TypeError):
        F._norm(b"abc")  # type: ignore[arg-type]
    assert F._norm("") == "" and F._norm(" \n ") == ""
