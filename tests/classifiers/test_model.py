import subprocess
import sys
from pathlib import Path

import pytest

from classifiers import Classifier, Prediction, load_default
from classifiers.kinds import KINDS


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return load_default()


def test_load_default_is_cached(clf: Classifier) -> None:
    assert load_default() is clf


def test_prediction_fields(clf: Classifier) -> None:
    pred = clf.predict({"prompt": "Write a Python function that reverses a string."})
    assert isinstance(pred, Prediction)
    assert 0.0 <= pred.p_structured <= 1.0
    assert pred.label == ("structured" if pred.p_structured > 0.5 else "open-ended")
    assert pred.kind in KINDS


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"prompt": None},
        {"prompt": 12},
        {"prompt": ""},
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": None}]},
        {"prompt": "x" * 1_000_000},
        {"prompt": "\x00\ud800 weird \uffff"},
        {"prompt": "a", "temperature": float("nan")},
    ],
)
def test_never_raises(clf: Classifier, body: dict) -> None:
    pred = clf.predict(body)
    assert 0.0 <= pred.p_structured <= 1.0
    assert pred.kind in KINDS


def test_not_a_mapping_gives_neutral(clf: Classifier) -> None:
    pred = clf.predict("just a string")  # type: ignore[arg-type]
    assert pred.p_structured == 0.5


def test_huge_prompt_with_instruction_at_the_end(clf: Classifier) -> None:
    story = "It was a quiet evening in the village and the baker was closing his shop. " * 400
    summary = clf.predict({"prompt": story + "\n\nSummarise the text above in three bullet points."})
    poem = clf.predict(
        {"prompt": story + "\n\nWhat do you think of this? Write me a poem about how it makes you feel."}
    )
    assert summary.p_structured > poem.p_structured
    assert poem.label == "open-ended"


def test_request_fields_move_the_probability(clf: Classifier) -> None:
    base = {"messages": [{"role": "user", "content": "Tell me about the weather in Paris."}]}
    plain = clf.predict(base).p_structured
    assert clf.predict({**base, "response_format": {"type": "json_object"}}).p_structured > plain
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with_tools = clf.predict({**base, "tools": tools})
    assert with_tools.p_structured > plain and with_tools.kind == "tools"
    assert (
        clf.predict({**base, "temperature": 1.8}).p_structured
        < clf.predict({**base, "temperature": 0.0}).p_structured
    )


def test_a_system_prompt_that_defines_functions_moves_it_like_tools_do(clf: Classifier) -> None:
    ask = {"role": "user", "content": "Book a table for two at Rosa's tomorrow at eight."}
    persona = {"role": "system", "content": "You are a friendly concierge."}
    contract = {
        "role": "system",
        "content": 'Tools: [{"name": "book_table", "parameters": {"type": "object", "properties": {}}}]. '
        "Reply with a JSON function call only.",
    }
    plain = clf.predict({"messages": [persona, ask]}).p_structured
    called = clf.predict({"messages": [contract, ask]})
    assert called.p_structured > plain and called.label == "structured"
    assert "request:system_json" in dict(clf.explain({"messages": [contract, ask]}, top=50))
    # the request's own tools field is the stronger sign and replaces it
    tools = [{"type": "function", "function": {"name": "book_table"}}]
    both = clf.explain({"messages": [contract, ask], "tools": tools}, top=50)
    assert "request:tools" in dict(both) and "request:system_json" not in dict(both)


def test_non_english(clf: Classifier) -> None:
    assert clf.predict({"prompt": "用Python写一个快速排序函数。"}).label == "structured"
    assert clf.predict({"prompt": "给我讲一个关于月亮的童话故事吧。"}).label == "open-ended"
    pred = clf.predict({"prompt": "Écris un poème sur la mer et le vent d'automne."})
    assert 0.0 <= pred.p_structured <= 1.0


def test_long_chat_ending_in_chit_chat_is_open_ended(clf: Classifier) -> None:
    msgs = []
    for i in range(12):
        msgs.append(
            {
                "role": "user",
                "content": f"Here is version {i}:\n```python\ndef f(x):\n    return x * {i}\n```",
            }
        )
        msgs.append({"role": "assistant", "content": "Looks fine. The function multiplies its input."})
    msgs.append({"role": "user", "content": "Thanks! Anyway, how was your weekend? Did you do anything fun?"})
    assert clf.predict({"messages": msgs}).label == "open-ended"


def test_explain(clf: Classifier) -> None:
    body = {"prompt": "Repeat the following line 10 times:\nHello world", "tools": [{"type": "function"}]}
    top = clf.explain(body, top=5)
    assert 0 < len(top) <= 5
    assert all(isinstance(name, str) and isinstance(c, float) for name, c in top)
    assert [abs(c) for _, c in top] == sorted((abs(c) for _, c in top), reverse=True)
    assert "request:tools" in dict(clf.explain(body, top=50))


def test_save_load_roundtrip(clf: Classifier, tmp_path: Path) -> None:
    path = tmp_path / "m.json.gz"
    clf.save(path)
    again = Classifier.load(path)
    body = {"prompt": "Convert this CSV to JSON:\na,b\n1,2"}
    assert again.predict(body) == clf.predict(body)


PASSAGE = (
    "The harbour town grew around its fish market in the eighteenth century. Boats left before dawn and "
    "returned by noon, and the catch was sold on the quay to traders from the inland villages. "
) * 12

POEM = (
    "The kettle hums before the light,\nthe window holds a grey-blue sky,\n"
    "the cat returns from half the night,\nand no one asks the reason why."
)
_COPY_MISS = (
    "known miss: a copy request over verse, or in German, reads as its material (VARIANTS.md, fourth round)"
)

STRUCTURED = [
    pytest.param(
        "Repeat this poem back to me exactly as it is:\n\n" + POEM,
        marks=pytest.mark.xfail(strict=True, reason=_COPY_MISS),
    ),
    pytest.param(
        "Bitte kopiere die erste und die letzte Zeile des folgenden Gedichts:\n" + POEM,
        marks=pytest.mark.xfail(strict=True, reason=_COPY_MISS),
    ),
    # the instruction outweighs the numbered prose lines it points at
    "Copy lines 2-4 from the text below.\n" + "\n".join(f"Line {i}: {PASSAGE[:80]}" for i in range(1, 8)),
    PASSAGE + "\n\nQuestion: When did the boats return to the harbour?",
    pytest.param(
        "Create a responsive login page in Flutter with a dark theme.",
        marks=pytest.mark.xfail(
            strict=True, reason="known miss: prose coding requests without code words read as open-ended"
        ),
    ),
    "Write a SQL query that returns the five customers with the highest total order value.",
    "Summarize the following text in three bullet points.\n\n" + PASSAGE,
    "Extract all the dates mentioned in this paragraph: The treaty was signed on 4 May 1921 and ratified "
    "on 12 January 1922.",
]
OPEN_ENDED = [
    "Write a poem in the same style as this one, about the sea:\n" + POEM,
    "Escribe un cuento corto sobre un dragón que tiene miedo a volar.",
    "Napiš krátkou povídku o kocourovi, který se ztratil ve velkém městě.",
    "Write a poem about the first snow of winter.",
    "What do you think is the meaning of a good life?",
    "hey, how was your day? anything fun happen?",
]


@pytest.mark.parametrize("prompt", STRUCTURED)
def test_structured_prompts(clf: Classifier, prompt: str) -> None:
    assert clf.predict({"prompt": prompt}).label == "structured", clf.explain({"prompt": prompt})


@pytest.mark.parametrize("prompt", OPEN_ENDED)
def test_open_ended_prompts(clf: Classifier, prompt: str) -> None:
    assert clf.predict({"prompt": prompt}).label == "open-ended", clf.explain({"prompt": prompt})


def test_the_instruction_outweighs_the_pasted_text(clf: Classifier) -> None:
    copy = clf.predict({"prompt": "Copy lines 2-4 from the text below.\n\n" + PASSAGE})
    story = clf.predict({"prompt": "Write a story inspired by the text below.\n\n" + PASSAGE})
    assert copy.p_structured > story.p_structured


@pytest.mark.xfail(
    strict=True,
    reason="known miss: the corpus holds bare prompts only, so nothing teaches what a system prompt implies",
)
def test_system_prompt_decides_between_retrieval_and_persona(clf: Classifier) -> None:
    docs = "[1] The Nile is about 6,650 km long and flows north into the Mediterranean.\n" * 5
    rag = {
        "messages": [
            {"role": "system", "content": "Answer using only the context below.\n\n" + docs},
            {"role": "user", "content": "How long is the Nile?"},
        ]
    }
    persona = {
        "messages": [
            {"role": "system", "content": "You are a pirate captain. Stay in character.\n\n" + docs},
            {"role": "user", "content": "How long is the Nile?"},
        ]
    }
    assert clf.predict(rag).label == "structured"
    assert clf.predict(persona).label == "open-ended"


def test_serving_imports_no_numerical_libraries() -> None:
    code = (
        "import sys, classifiers\n"
        "classifiers.load_default().predict({'prompt': 'Write a haiku about rain.'})\n"
        "heavy = sorted(m for m in ('numpy', 'scipy', 'sklearn') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
