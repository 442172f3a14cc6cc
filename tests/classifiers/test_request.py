from classifiers.request import view


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


def test_wrong_types_give_empty_view() -> None:
    v = view({"messages": "not a list", "temperature": "hot", "max_tokens": True, "stop": 3})
    assert v.text == "" and v.temperature is None and v.max_tokens is None and not v.stop_structured
    assert view({"messages": [None, 3, {"role": "user", "content": 5}]}).text == ""
