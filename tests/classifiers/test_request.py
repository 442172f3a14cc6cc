from hypothesis import given
from hypothesis import strategies as st

from classifiers.request import MAX_CHARS, _tail, view


def test_completions_prompt_string_and_list() -> None:
    assert view({"prompt": "hello"}).text == "hello"
    assert view({"prompt": ["first", "second"]}).text == "first"
    assert view({"prompt": [[1, 2, 3]]}).text == ""


def test_chat_uses_last_user_turn_and_keeps_context() -> None:
    v = view(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Write a poem."},
                {"role": "assistant", "content": "Roses are red."},
                {"role": "user", "content": [{"type": "text", "text": "Now in JSON"}, {"type": "image_url"}]},
            ]
        }
    )
    assert v.text == "Now in JSON"
    assert "Be brief." in v.context and "Roses are red." in v.context
    assert v.turns == 4 and v.has_system


def test_request_fields() -> None:
    v = view(
        {
            "prompt": "x",
            "response_format": {"type": "json_schema", "json_schema": {}},
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "temperature": 0.2,
            "stop": ["```"],
            "max_tokens": 8,
        }
    )
    assert (
        v.constrained == 1.0 and v.tools and v.temperature == 0.2 and v.stop_structured and v.max_tokens == 8
    )
    assert not view({"prompt": "x", "tools": [{"type": "function"}], "tool_choice": "none"}).tools
    assert view({"prompt": "x", "guided_regex": "[a-z]+"}).constrained == 1.0


def test_a_constraint_weighs_the_same_in_either_of_vllms_spellings() -> None:
    """vLLM maps ``guided_json``, ``guided_choice``... onto ``structured_outputs``' members."""
    pairs = [
        ({"guided_json": {"type": "object"}}, {"json": {"type": "object"}}),
        ({"guided_regex": "[a-z]+"}, {"regex": "[a-z]+"}),
        ({"guided_grammar": "root ::= x"}, {"grammar": "root ::= x"}),
        ({"guided_choice": ["a", "b"]}, {"choice": ["a", "b"]}),
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ]
    for old, new in pairs:
        assert (
            view({"prompt": "x", **old}).constrained
            == view({"prompt": "x", "structured_outputs": new}).constrained
            > 0
        )
    assert view({"prompt": "x", "structured_outputs": {}}).constrained == 0.0


def test_the_output_limit_is_read_as_vllm_reads_it() -> None:
    """vLLM's chat limits the output to ``max_completion_tokens or max_tokens``."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert view({**chat, "max_completion_tokens": 7, "max_tokens": 12}).max_tokens == 7
    assert view({**chat, "max_completion_tokens": 7, "max_tokens": None}).max_tokens == 7
    assert view({**chat, "max_completion_tokens": None, "max_tokens": 12}).max_tokens == 12
    assert view({**chat, "max_completion_tokens": 0, "max_tokens": 12}).max_tokens == 12


def test_a_system_prompt_that_asks_for_json_or_defines_functions() -> None:
    def with_system(content: str, role: str = "system") -> bool:
        msgs = [{"role": role, "content": content}, {"role": "user", "content": "Book me a table for two."}]
        return view({"messages": msgs}).system_json

    assert with_system("Reply only with a JSON object {name, arguments}.")
    assert with_system('Functions: [{"name": "book", "parameters": {"type": "object"}}]')
    assert with_system("Antworte ausschließlich im JSON-Format.", role="developer")
    assert not with_system("You are a friendly travel agent. Keep answers short.")
    # an earlier user or assistant turn that mentions JSON is not a contract for this reply
    msgs = [
        {"role": "user", "content": "What is JSON?"},
        {"role": "assistant", "content": "A text format."},
        {"role": "user", "content": "Tell me a joke."},
    ]
    assert not view({"messages": msgs}).system_json
    # a contract far down a very long system prompt is not looked for
    assert not with_system("Be helpful. " * 1000 + "Answer in JSON.")


def test_wrong_types_give_empty_view() -> None:
    v = view({"messages": "not a list", "temperature": "hot", "max_tokens": True, "stop": 3})
    assert v.text == "" and v.temperature is None and v.max_tokens is None and not v.stop_structured
    assert view({"messages": [None, 3, {"role": "user", "content": 5}]}).text == ""


@given(
    st.lists(st.text(max_size=12), max_size=8),
    st.integers(min_value=1, max_value=60),
    st.sampled_from(["\n", "", "ab"]),
)
def test_the_context_tail_is_the_tail_of_the_whole_history(parts: list[str], limit: int, sep: str) -> None:
    assert _tail(sep, parts, limit) == sep.join(parts)[-limit:]


def test_a_history_longer_than_the_limit_keeps_its_last_characters() -> None:
    turns = [
        {"role": "user" if i % 2 else "assistant", "content": f"{i:03d}" + "x" * 99_996} for i in range(8)
    ]
    v = view({"messages": [*turns, {"role": "user", "content": "and now?"}]})
    history = "\n".join(t["content"] for t in turns)
    assert v.text == "and now?" and v.context == history[-MAX_CHARS:] and len(v.context) == MAX_CHARS
