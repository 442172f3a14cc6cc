# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""The whole prediction in C (``classifiers/_grams.c`` ``Scorer``, ``Classifier._scorer``) against the Python
it stands in for (``extract``, ``score``, ``calibrated``, ``_shift``, ``_sigmoid``, ``kind_of``): the same
p_structured, compared by its float's bits, the same label and kind. A prompt whose scanned window holds a
character from U+3040 on is read by the Python with sets (its cues also read CJK characters and pairs), and
by the scorer with the same sets summed in their order: the same bits too, in CJK, kana, Hangul and mixed
scripts."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import classifiers.features as F
import classifiers.model as M
from classifiers.calibration import Calibration
from classifiers.model import Classifier, Prediction, load_default
from classifiers.request import view
from tests.classifiers.test_grams_dense import JSON, PASSAGE, _bodies, _prompts

needs_c = pytest.mark.skipif(M.SCORER is None, reason="classifiers._grams was not built")


def _python(clf: Classifier, body: dict[str, Any]) -> Prediction:
    scorer = clf._scorer
    clf._scorer = None
    try:
        return clf.predict(body)
    finally:
        clf._scorer = scorer


def _bits(p: Prediction) -> tuple[str, str, str]:
    return p.p_structured.hex(), p.label, p.kind


def _same(clf: Classifier, body: dict[str, Any]) -> bool:
    """The scorer's prediction is the Python's, bit for bit; True where the scorer read it itself."""
    assert clf._scorer is not None
    c = clf.predict(body)
    assert _bits(c) == _bits(_python(clf, body)), body
    v = view(body)
    try:
        direct = clf._scorer.predict(v.text, v.context, v.turns, v.has_system, v.tools, v.constrained, 0.0)
    except Exception:
        return True  # an error the Python raises too: the neutral prediction, compared above
    return direct is not None


def _more_bodies() -> Iterator[dict[str, Any]]:
    """Prompts around the windows' edges and the last segment's marks, in chats and with request fields."""
    r = random.Random(11)
    marks = [
        ". ",
        "! ",
        "? ",
        "; ",
        ": ",
        "。",
        "。 ",
        "\u3000",
        ".\t",
        " ",
        "\n",
        "\n\n",
        "x",
        "İ",
        "Σ",
        "ς",
    ]
    for n in (
        119,
        120,
        121,
        159,
        160,
        161,
        239,
        240,
        241,
        249,
        250,
        279,
        280,
        281,
        300,
        301,
        408,
        409,
        550,
        551,
        552,
        600,
        2000,
    ):
        for tail in (
            "",
            "Copy the last line.",
            "。",
            "x。",
            "x。。",
            "a. b",
            "a.  \t",
            "Who? When:",
            "é" * 299,
            "é" * 300,
            "Σ" * 5,
            "\n   \n",
        ):
            text = ("Lorem ipsum dolor sit amet, 12 consectetur; " * 60)[: max(n - len(tail), 0)] + tail
            yield {"prompt": text}
    for _ in range(300):
        n = r.choice([5, 50, 200, 300, 400, 700, 3000])
        text = "".join(
            r.choice(marks) if r.random() < 0.2 else r.choice(["word", "Tab", "12", "é", "-"])
            for _ in range(n // 3)
        )
        yield {"prompt": text}
    yield {"prompt": PASSAGE, "response_format": {"type": "json_schema", "json_schema": {}}}
    yield {"prompt": JSON, "stop": ["```", "\n"], "temperature": 2.0, "max_tokens": 5}
    yield {
        "messages": [
            {"role": "system", "content": "Reply in JSON."},
            {"role": "user", "content": "Name three."},
        ]
    }
    yield {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            *[{"role": "user" if i % 2 else "assistant", "content": f"turn {i}"} for i in range(7)],
        ]
    }
    yield from _cjk_bodies()


# pieces in every script the cues meet: CJK words of the lexicons (重复, 代码, 翻译, 诗 ...), kana, Hangul,
# full-width marks (the last segment's CJK sentence ends, U+FF01 on), Arabic, Hebrew, Cyrillic, Devanagari,
# an emoji outside the BMP, combining marks, Latin words of the lexicons and digits
_CJK_PIECES = [
    "请把下面的文字翻译成英文。",
    "重复这句话三遍",
    "写一首关于秋天的诗，",
    "用Python写代码：",
    "根据上文回答问题？",
    "日本語の文章を書いてください。",
    "これはテストです",
    "カタカナー・テスト！",
    "한국어 텍스트를 작성하세요",
    "요약해 주세요：",
    "مرحبا بالعالم ",
    "שלום עולם ",
    "Привет мир ",
    "नमस्ते दुनिया ",
    "😀🎉👍 ",
    "e\u0301a\u0308 ",
    "Write a poem about the sea. ",
    "Copy the json below: ",
    "12, 13, 14, 15; ",
    "\n",
    "\n\n",
    "ｆｕｌｌ　ｗｉｄｔｈ",
]


def _cjk_bodies() -> Iterator[dict[str, Any]]:
    """CJK, kana, Hangul and mixed-script prompts around every window's edge: runs cut by the head and tail
    windows, runs longer than CJK_MAX, a lexicon's CJK pair split by a window's end, chats with CJK system
    prompts."""
    r = random.Random(23)
    run = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(5000))  # one run of 5,000 CJK characters
    yield {"prompt": run}
    yield {"prompt": run[: F.CJK_MAX + 1] + " copy " + run[: F.CJK_MAX + 1]}
    edges = [F.CHAR_HEAD, F.HEAD_NS, F.TAIL_NS, F.HEAD + 1, F.LAST_MIN_TEXT, F.LAST_MAX, F.HEAD + F.TAIL + 1]
    for n in (1, 2, 2000, *(e + d for e in edges for d in (-1, 0, 1))):
        for piece in ("重复", "诗", "翻译", "한국", "カナ"):
            latin = ("Lorem ipsum dolor sit amet, 12 consectetur; " * 60)[:n]
            # the piece at the end of the head window, at the start of the tail window, and ending the text
            yield {"prompt": latin[: F.HEAD_NS - 1] + piece + latin[F.HEAD_NS - 1 :]}
            yield {"prompt": latin[: max(n - F.TAIL_NS - 1, 0)] + piece + latin[max(n - F.TAIL_NS - 1, 0) :]}
            yield {"prompt": latin + piece}
            yield {"prompt": run[:n] + piece + latin}
    for _ in range(400):
        n = r.choice([10, 100, 161, 241, 400, 551, 900, 4000])
        text = ""
        while len(text) < n:
            text += r.choice(_CJK_PIECES)
        body: dict[str, Any] = {"prompt": text[:n] if r.random() < 0.5 else text[-n:]}
        if r.random() < 0.2:
            body = {
                "messages": [
                    {"role": "system", "content": r.choice(_CJK_PIECES) * r.randint(1, 60)},
                    {"role": "user", "content": body["prompt"]},
                ]
            }
        yield body


@needs_c
def test_the_shipped_model_predicts_in_c() -> None:
    clf = load_default()
    assert clf._scorer is not None
    assert clf._scorer.predict("Write one sentence.", "", 1, False, False, 0.0, 0.0) == clf.predict(
        {"prompt": "Write one sentence."}
    )


@needs_c
def test_every_prompt_gets_the_python_prediction() -> None:
    clf = load_default()
    bodies = [*_bodies(), *_more_bodies()]
    read = sum(_same(clf, body) for body in bodies)
    assert len(bodies) > 600 and read > 500


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(
            [*"aZé 09.!?;:,-*\n\t\"'{}=#|`", "。", "！", "\u3000", "\x85", "İ", "Σ", "ß", "²"]
        ),
        max_size=900,
    ),
    context=st.sampled_from(["", "You are a pirate.", "Answer from the documents: " + PASSAGE]),
    temperature=st.sampled_from([None, 0.0, 1.5]),
)
def test_generated_texts_get_the_python_prediction(
    text: str, context: str, temperature: float | None
) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if context:
        body["messages"].insert(0, {"role": "system", "content": context})
    if temperature is not None:
        body["temperature"] = temperature
    _same(load_default(), body)


def _variant(**changes: Any) -> Classifier:
    shipped = load_default()
    args: dict[str, Any] = {
        "bias": shipped.bias,
        "sparse": shipped.sparse,
        "dense": shipped.dense,
        "threshold": shipped.threshold,
        "calibration": shipped.calibration,
    }
    args.update(changes)
    return Classifier(**args)


def _some(table: dict[str, float], every: int) -> dict[str, float]:
    return {g: w for i, (g, w) in enumerate(sorted(table.items())) if i % every == 0}


@needs_c
@pytest.mark.parametrize(
    "changes",
    [
        {"calibration": None},
        {"calibration": Calibration(z=(0.0,), p=(0.7,)), "threshold": 0.9},
        {"bias": -0.0, "dense": {}},
        # the namespaces the shipped model leaves out: the body's and the chat context's characters and words
        {"sparse": "wide"},
        {"sparse": "no twins"},
    ],
)
def test_other_models_get_the_python_prediction(changes: dict[str, Any]) -> None:
    shipped = load_default()
    if changes.get("sparse") == "wide":
        changes["sparse"] = {
            **shipped.sparse,
            "cb": _some(shipped.sparse["ch"], 3),
            "cx": _some(shipped.sparse["ct"], 2),
            "x": _some(shipped.sparse["wt"], 2),
        }
    elif changes.get("sparse") == "no twins":
        changes["sparse"] = {ns: t for ns, t in shipped.sparse.items() if ns not in ("ct", "wh")}
    clf = _variant(**changes)
    assert clf._scorer is not None
    for body in [*_bodies(), *_more_bodies()]:
        _same(clf, body)


@needs_c
def test_weights_that_are_not_floats_keep_the_python() -> None:
    shipped = load_default()
    assert _variant(dense={**shipped.dense, "lines": 1})._scorer is None
    assert _variant(sparse={**shipped.sparse, "f": {"write": 1}})._scorer is None
    assert _variant(calibration=Calibration(z=(0, 1), p=(0.2, 0.8)))._scorer is None


@needs_c
def test_a_cjk_window_is_read_in_c() -> None:
    clf = load_default()
    assert clf._scorer is not None
    for text in (
        "请把下面的文字翻译成英文",
        "x" * 600 + "ぁ",
        "x" * 300 + "ぁ" + "x" * 300,
        "。 x",
        "한국어 😀",
    ):
        assert clf._scorer.predict(text, "", 1, False, False, 0.0, 0.0) == clf.predict({"prompt": text})
    # the CJK cue words are read as characters and character pairs: 翻译 is a rewrite, 诗 a poem
    assert clf.predict({"prompt": "请把下面的文字翻译成英文"}).kind == "rewrite"
    assert clf.predict({"prompt": "写一首关于秋天的诗"}).kind == "creative"


@needs_c
@pytest.mark.parametrize("body", list(_cjk_bodies())[::7], ids=lambda b: str(len(str(b))))
def test_cjk_and_mixed_script_prompts_get_the_python_prediction_in_c(body: dict[str, Any]) -> None:
    assert _same(load_default(), body)


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(st.sampled_from(_CJK_PIECES), max_size=120).map("".join),
    cut=st.integers(min_value=0, max_value=1200),
    context=st.sampled_from(["", "你是一个翻译助手。", "You are a pirate."]),
)
def test_generated_cjk_texts_get_the_python_prediction_in_c(text: str, cut: int, context: str) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text[cut:]}]}
    if context:
        body["messages"].insert(0, {"role": "system", "content": context})
    assert _same(load_default(), body) or not text[cut:].strip()


@needs_c
def test_a_cjk_window_with_a_word_weight_that_is_not_a_float_is_handed_back() -> None:
    shipped = load_default()
    clf = _variant(sparse={**shipped.sparse, "wl": {**shipped.sparse["wl"], "copy": 1}})
    assert clf._scorer is not None  # the word tables' weights are read into the hash tables as floats
    text = "x" * 300 + " 请把下面的文字翻译成英文\ncopy"
    assert clf._scorer.predict(text, "", 1, False, False, 0.0, 0.0) is None
    # without a CJK character the words are read as hashes, the weight taken as the float it is
    assert clf._scorer.predict("x" * 300 + " translate\ncopy", "", 1, False, False, 0.0, 0.0) is not None
    assert _bits(clf.predict({"prompt": text})) == _bits(_python(clf, {"prompt": text}))


@needs_c
def test_the_scorer_fails_where_the_python_fails() -> None:
    clf = load_default()
    assert clf._scorer is not None
    # a lone surrogate in the scanned window: ``str.encode`` refuses it in the Python's structural cues
    with pytest.raises(UnicodeEncodeError):
        clf._scorer.predict("x \ud800 y", "", 1, False, False, 0.0, 0.0)
    with pytest.raises(ValueError, match="math domain"):
        clf._scorer.predict("x", "", 0, False, False, 0.0, 0.0)
    with pytest.raises(TypeError):
        clf._scorer.predict(b"x", "", 1, False, False, 0.0, 0.0)  # type: ignore[arg-type]
    assert clf.predict({"prompt": "copy \ud800 this"}) == M.NEUTRAL


def test_without_the_extension_the_python_predicts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "classifiers._grams", None)
    assert M._c_scorer() is None and F._c_dense_reader() is None
    monkeypatch.setattr(M, "SCORER", None)
    clf = _variant()
    assert clf._scorer is None
    assert clf.predict({"prompt": "Write one sentence."}) == load_default().predict(
        {"prompt": "Write one sentence."}
    )
    for body in list(_cjk_bodies())[::25]:
        plain, fast = clf.predict(body), load_default().predict(body)
        assert (plain.label, plain.kind) == (fast.label, fast.kind)
        assert plain.p_structured == pytest.approx(fast.p_structured, abs=1e-12)


@needs_c
def test_the_written_prompts_are_all_read_in_c() -> None:
    clf = load_default()
    assert clf._scorer is not None
    for prompt in _prompts():
        assert clf._scorer.predict(prompt, "", 1, False, False, 0.0, 0.0) is not None, prompt
