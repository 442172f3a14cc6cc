# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""The classifier's fast paths against plain definitions: the score against the flat features dotted with
the weights (what training fits), the guarded structural cues against their unguarded computation, and the
tokeniser, character grams and normalisation against the slow but obvious forms. A change to a fast path
that moves any prediction fails here."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from classifiers import features as F
from classifiers.features import as_dict, extract
from classifiers.model import Classifier, load_default, request_shift
from classifiers.request import RequestView, view

PASSAGE = (
    "The harbour froze in the winter of 1709. Fishermen walked to the island, 3 km out, and back.\n"
    "name: Ada\nage = 36\n- one\n* two\n• three\n12. twelve\n"
    "user: hi there\nassistant: hello\n| a | b | c |\nx,y,z\n```\ndef f(x):\n    return x\n```\n"
)
PROMPTS = [
    "",
    " \n\t ",
    "Write one sentence about benchmarking proxies.",
    "List 1, 2, 3, 5, 8, 13 and continue the sequence?",
    "Summarise: " + "a" * 140,  # 120 < length <= 160: one word window, two character windows
    "Translate this paragraph into French, keeping every name as it is: " + "b " * 60,  # 160 < len <= 240
    "上司が非倫理的なことをするよう頼んだらどうしますか?",
    "请把下面的文字翻译成英文：今天天气很好，我们去公园散步吧。" * 3,
    "Bitte fasse den Text zusammen: Über die Brücke gingen ²³ Leute.",
    "x² + y² = z²; solve for z when x = 3 and y = 4",
    PASSAGE,
    PASSAGE * 8 + "\nWho walked to the island, and when?",
    "Copy lines 2-4 from the text below:\n" + PASSAGE * 5,
    "用户：你好\n助手：你好！\n用户：讲个笑话",
    "ΑΣ ΣΑ σς " * 30,
    "\x1c\x1d separators \x85 and \xa0 spaces",
]
BODIES: list[dict[str, Any]] = [{"prompt": p} for p in PROMPTS] + [
    {
        "messages": [
            {"role": "system", "content": "Answer only from the documents below.\n" + PASSAGE},
            {"role": "user", "content": "Who walked to the island?"},
        ],
        "temperature": 0.2,
    },
    {
        "messages": [
            {"role": "system", "content": "You are a pirate. Stay in character."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Arr!"},
            {"role": "user", "content": "Tell me about your ship." * 20},
        ],
        "max_tokens": 16,
        "response_format": {"type": "json_object"},
    },
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 'Return JSON: {"a": 1}'}]}]},
]


def _reference_score(clf: Classifier, f: F.Features) -> float:
    """The definition: the bias plus the flat features (each namespace at unit length) times their weights."""
    z = clf.bias
    for key, x in as_dict(f).items():
        ns, _, gram = key.partition(":")
        z += (clf.dense if ns == "d" else clf.sparse.get(ns, {})).get(gram, 0.0) * x
    return z


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return load_default()


@pytest.mark.parametrize("body", BODIES)
def test_score_equals_the_flat_features_dotted_with_the_weights(
    clf: Classifier, body: dict[str, Any]
) -> None:
    f = extract(view(body))
    assert clf.score(f) == pytest.approx(_reference_score(clf, f), abs=1e-12)


@pytest.mark.parametrize("body", BODIES)
def test_prediction_equals_the_reference(clf: Classifier, body: dict[str, Any]) -> None:
    v = view(body)
    got = clf.predict(body)
    if not v.text.strip() and not v.context.strip():
        assert got.p_structured == pytest.approx(_sigmoid(sum(request_shift(v).values())), abs=1e-12)
        return
    z = clf.calibrated(_reference_score(clf, extract(v))) + sum(request_shift(v).values())
    assert got.p_structured == pytest.approx(_sigmoid(z), abs=1e-12)


def test_short_prompts_take_the_merged_tables_and_long_ones_do_not(clf: Classifier) -> None:
    short = extract(view({"prompt": "Write one sentence about benchmarking proxies."}))
    assert short.sparse["ch"] is short.sparse["ct"] and short.sparse["wh"] is short.sparse["wt"]
    long = extract(view({"prompt": PASSAGE * 3}))
    assert long.sparse["ch"] is not long.sparse["ct"] and long.sparse["wh"] is not long.sparse["wt"]
    # equal sets that are distinct objects take the plain way, with the same result
    twin = F.Features(sparse={**short.sparse, "ct": set(short.sparse["ch"])}, dense=short.dense)
    assert clf.score(twin) == pytest.approx(clf.score(short), abs=1e-12)


def test_merged_tables_sum_both_windows_weights() -> None:
    clf = Classifier(
        bias=0.5,
        sparse={"wh": {"json": 1.0, "poem": -2.0}, "wt": {"json": 0.25, "list": 3.0}, "ch": {"js": 0.5}},
        dense={"len": 0.1},
    )
    f = extract(view({"prompt": "json list poem"}))
    assert f.sparse["wh"] is f.sparse["wt"]
    assert clf.score(f) == pytest.approx(_reference_score(clf, f), abs=1e-12)
    explained = dict(clf.explain({"prompt": "json list poem"}, top=100))
    assert explained["wh:json"] == round(1.0 / math.sqrt(len(f.sparse["wh"])), 4)
    assert explained["wt:json"] == round(0.25 / math.sqrt(len(f.sparse["wt"])), 4)


# --- the structural cues: the unguarded computation is the definition ---


def _plain_dense(
    text: str, scanned: str, tokens: list[str], words: set[str], cue_grams: set[str], view: RequestView
) -> dict[str, float]:
    log = F._log
    n = max(len(scanned), 1)
    lines = [ln for ln in map(str.strip, scanned.split("\n")) if ln]
    nl = max(len(lines), 1)
    counts = Counter(lines)
    max_rep = max(counts.values(), default=0)
    head = scanned[:600]
    symbols = sum(map(scanned.count, F._SYMBOLS))
    tabular = sum(1 for ln in lines if ln.count(",") >= 2 or ln.count("|") >= 2 or ln.count("\t") >= 2)
    stripped = text.rstrip()
    instruction = text[: F.HEAD_NS] + "\n" + text[-F.TAIL_NS :]
    out = {
        "len": log(len(text), 9.0),
        "lines": log(len(lines), 5.0),
        "dup_lines": (len(lines) - len(counts)) / nl,
        "max_rep": log(max_rep - 1, 3.0) if max_rep > 1 else 0.0,
        "fence": 1.0 if "```" in scanned else 0.0,
        "symbols": min(1.0, 12.0 * symbols / n),
        "indent": (scanned.count("\n    ") + scanned.count("\n\t")) / nl,
        "json_keys": log(scanned.count('":') + scanned.count("':"), 3.0),
        "kv_lines": len(F._KV_LINE.findall(scanned)) / nl,
        "bullets": len(F._BULLET.findall(scanned)) / nl,
        "tabular": tabular / nl,
        "digits": min(1.0, 3.0 * tokens.count("#") / max(len(tokens), 1)),
        "numseq": 1.0 if F._NUMSEQ.search(instruction) else 0.0,
        "code_kw": log(len(words & F.CODE_KEYWORDS), 2.5),
        "question_end": 1.0 if stripped.endswith(("?", "？")) else 0.0,
        "questions": log(scanned.count("?") + scanned.count("？"), 2.5),
        "speakers": log(len(F._SPEAKER.findall(scanned)), 2.5),
        "paragraphs": log(scanned.count("\n\n"), 3.0),
        "non_ascii": min(1.0, (len(head.encode()) - len(head)) / (2 * max(len(head), 1))),
        "turns": log(view.turns - 1, 3.0),
        "system": 1.0 if view.has_system else 0.0,
        "context_len": log(len(view.context), 9.0),
        "empty": 1.0 if not stripped else 0.0,
    }
    out.update(_plain_layout(stripped))
    for key, lex in F._CUE_KEYS:
        out[key] = 0.0 if cue_grams.isdisjoint(lex) else 1.0
    if view.context:
        ctx_grams = F._ngrams(F._tokens(view.context[: F.CONTEXT_HEAD_NS].lower()))
        for key, lex in F._CONTEXT_KEYS:
            out[key] = 0.0 if ctx_grams.isdisjoint(lex) else 1.0
    return out


def _plain_layout(text: str) -> dict[str, float]:
    if len(text) <= F.CHAR_HEAD + F.CHAR_TAIL or "\n" not in text:
        return {}
    first, last = text.partition("\n")[0].strip(), text.rpartition("\n")[2].strip()
    out = {}
    for name, line in (("last", last), ("first", first)):
        if 0 < len(line) <= 300:
            out[f"layout_{name}_line"] = 1.0
            if line.endswith(F._QUESTION_ENDS):
                out[f"layout_{name}_question"] = 1.0
            elif line.endswith((":", "：")):
                out[f"layout_{name}_colon"] = 1.0
    return out


def _plain_char_windows(text: str) -> tuple[str, str, str]:
    head, tail = F._norm(text[: F.CHAR_HEAD]), F._norm(text[-F.CHAR_TAIL :])
    if len(text) <= F.CHAR_HEAD:
        return head, head, ""
    if len(text) <= F.CHAR_HEAD + F.CHAR_TAIL:
        return head, tail, ""
    body = text[F.CHAR_HEAD : -F.CHAR_TAIL]
    if len(body) > 2 * F.CHAR_BODY:
        body = body[: F.CHAR_BODY] + "\n" + body[-F.CHAR_BODY :]
    return head, tail, F._norm(body)[: 2 * F.CHAR_BODY]


# long prompts whose ends are white space, a question, a colon; lines of every length
_LONG = st.builds(
    lambda lines, end: "\n".join(lines) + end,
    st.lists(st.text(alphabet="ab ?:\t", max_size=400), min_size=1, max_size=12),
    st.sampled_from(["", "\n", " \n\t", " " * 70, "\n" * 80 + "x", "?", "\nWhat is it?  \n"]),
)


@settings(max_examples=300, deadline=None)
@given(_LONG)
def test_layout_and_windows_read_without_copies_equal_the_plain_ones(text: str) -> None:
    assert F._layout(text) == _plain_layout(text)
    assert F._layout(text, len(text.rstrip())) == _plain_layout(text.rstrip())
    assert F.char_windows(text) == _plain_char_windows(text)
    fast, plain = _both_dense(text)
    assert list(fast.items()) == list(plain.items())


def _both_dense(text: str, context: str = "") -> tuple[dict[str, float], dict[str, float]]:
    body = {"messages": [{"role": "system", "content": context}, {"role": "user", "content": text}]}
    v = view(body) if context else view({"prompt": text})
    scanned = F.window(text)
    tokens = F._tokens(scanned.lower())
    words = F._ngrams(tokens)
    # ``_dense`` takes the word-level inputs counted (from the sets, or from the hashed reader)
    cues = tuple(0.0 if words.isdisjoint(lex) else 1.0 for _, lex in F._CUE_KEYS)
    context_cues = None
    if v.context:
        ctx_grams = F._ngrams(F._tokens(v.context[: F.CONTEXT_HEAD_NS].lower()))
        context_cues = tuple(0.0 if ctx_grams.isdisjoint(lex) else 1.0 for _, lex in F._CONTEXT_KEYS)
    counted = (len(tokens), tokens.count("#"), len(words & F.CODE_KEYWORDS), cues, context_cues)
    fast = F._dense(text, scanned, *counted, v)
    return fast, _plain_dense(text, scanned, tokens, words, words, v)


@pytest.mark.parametrize(
    "text", [*PROMPTS, PASSAGE * 2 + "\n\n" + PASSAGE, "a\nb\na\n" * 40, "Steps:\n1. open it\n2) close it"]
)
def test_dense_cues_equal_the_unguarded_ones(text: str) -> None:
    fast, plain = _both_dense(text, context="You are a helpful assistant." if len(text) % 2 else "")
    assert list(fast.items()) == list(plain.items())  # same values, same keys in the same order


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab Q:=-*•1２²,;|?？：\n\t.)用户A_"), max_size=700),
    st.text(alphabet=st.sampled_from("ab :\nrole"), max_size=40),
)
def test_dense_cues_equal_the_unguarded_ones_on_any_text(text: str, context: str) -> None:
    fast, plain = _both_dense(text, context)
    assert list(fast.items()) == list(plain.items())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab 1\u0663.)\n,;:="), max_size=120))
def test_dense_cues_equal_the_unguarded_ones_on_numbered_text(text: str) -> None:
    fast, plain = _both_dense(text)
    assert list(fast.items()) == list(plain.items())


# --- tokens, character grams, normalisation ---


def test_ascii_token_pattern_equals_the_unicode_one_on_every_ascii_character() -> None:
    every = "".join(map(chr, range(128)))
    for text in (every, every.lower(), " ".join(every), "ab12cd_ef #3 x\x1cy\x1fz"):
        assert F._TOKEN_ASCII.findall(text) == F._TOKEN.findall(text)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_tokens_equal_the_definition(text: str) -> None:
    assert F._tokens(text) == ["#" if t.isdigit() else t for t in F._TOKEN.findall(text)]


@given(st.text(alphabet=st.sampled_from("ab 1²③\u0663中\u0915\u093e#."), max_size=60))
def test_non_ascii_tokens_equal_the_definition(text: str) -> None:
    assert F._tokens(text) == ["#" if t.isdigit() else t for t in F._TOKEN.findall(text)]


@given(
    st.text(alphabet=st.sampled_from("abc \u00e9\u4e2d\U0001f600"), max_size=50),
    st.sampled_from([(2, 3, 4), (3,), (2,), (4, 2), (5,)]),
)
def test_character_grams_equal_every_substring(text: str, orders: tuple[int, ...]) -> None:
    assert F._chars(text, orders) == {text[i : i + n] for n in orders for i in range(len(text) - n + 1)}


_FOLD = str.maketrans("0123456789", "0000000000")


@given(st.text(alphabet=st.sampled_from("Ab 09 \t\n\u0663²\u00c9\u0130"), max_size=60))
def test_norm_equals_the_definition(text: str) -> None:
    assert F._norm(text) == " ".join(text.lower().translate(_FOLD).split())


@given(st.text(alphabet=st.sampled_from("a\u00e9\u303f\u3040\u4e2d\uffff\U00010000"), max_size=20))
def test_cjk_test_equals_the_maximum_character(text: str) -> None:
    assert bool(F._FROM_KANA.search(text)) == (bool(text) and max(text) >= "\u3040")


@given(st.text(alphabet=st.sampled_from("a中文字\n한국"), max_size=40))
def test_cjk_grams_equal_the_definition(text: str) -> None:
    want: set[str] = set()
    for run in re.findall(f"[{F._CJK_RANGES}]+", text):
        want.update(run)
        want.update(run[i : i + 2] for i in range(len(run) - 1))
    if sum(map(len, re.findall(f"[{F._CJK_RANGES}]+", text))) <= F.CJK_MAX:
        assert F._cjk_grams(text) == want
