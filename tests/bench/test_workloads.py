"""Prompt sets and request preparation."""

from __future__ import annotations

import orjson
import pytest

from gateway.bench import workloads


@pytest.mark.parametrize("name", workloads.BUILTIN)
def test_builtin_sets_are_labelled(name: str) -> None:
    w = workloads.builtin(name)
    assert len(w.prompts) >= 20
    assert len({p.text for p in w.prompts}) == len(w.prompts)
    expected = {"structured", "open-ended"} if name.startswith("mixed") else {name}
    assert set(w.labels()) == expected


def test_mixed_formats_asks_every_other_structured_task_for_verse() -> None:
    """The task reads as structured, the answer asked for is a haiku: under the ``output-format`` draft
    such a request gets the acceptance of what it asks for, which the classifier cannot see."""
    from gateway.emulator.acceptance import base_profile, load_profile

    plain = workloads.builtin("mixed").prompts
    varied = workloads.builtin("mixed-formats").prompts
    structured = [(a, b) for a, b in zip(plain, varied, strict=True) if a.label == "structured"]
    verse = [b for a, b in structured if b.text != a.text]
    assert len(verse) == len(structured) // 2
    assert all(b.text == a.text + workloads.VERSE_ANSWER for a, b in structured if b.text != a.text)
    profile = load_profile("output-format")
    assert {base_profile(p.text, profile).alpha for p in verse} == {0.15}
    kept = [b for a, b in structured if b.text == a.text]
    assert all(
        base_profile(p.text, profile) == base_profile(p.text, None)
        for p in kept
        if base_profile(p.text, None).category != "self-repetition"
    )


def test_unknown_builtin() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.builtin("poetry")


def test_load_file_forms(tmp_path) -> None:
    path = tmp_path / "w.jsonl"
    lines = [
        '"just a prompt"',
        '{"prompt": "count to ten", "label": "structured"}',
        '{"messages": [{"role": "user", "content": "hi"}], "label": "open-ended", "max_tokens": 7}',
        "",
        '{"prompt": "x", "temperature": 0.7, "label": "structured"}',
    ]
    path.write_text("\n".join(lines))
    w = workloads.load_file(path)
    assert [p.label for p in w.prompts] == ["unlabelled", "structured", "open-ended", "structured"]
    specs = workloads.prepare(w, model="m", max_tokens=32, stream=True)
    assert [s.path for s in specs] == [
        "/v1/completions",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/completions",
    ]
    bodies = [orjson.loads(s.body) for s in specs]
    assert "label" not in bodies[2]
    assert bodies[2]["max_tokens"] == 7  # the file's body wins over the command-line default
    assert bodies[3]["temperature"] == 0.7
    assert bodies[0]["max_tokens"] == 32
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in bodies)


def test_load_file_rejects_bad_lines(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"label": "structured"}\n')
    with pytest.raises(ValueError, match="needs 'prompt' or 'messages'"):
        workloads.load_file(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        workloads.load_file(path)


def test_prepare_non_streamed_chat_drops_stream_options() -> None:
    specs = workloads.prepare(workloads.builtin("structured"), api="chat", stream=False)
    body = orjson.loads(specs[0].body)
    assert body["stream"] is False and "stream_options" not in body
    assert body["messages"][0]["role"] == "user"


def test_order_is_seeded() -> None:
    specs = workloads.prepare(workloads.builtin("mixed"))
    assert workloads.order(specs, 1) == workloads.order(specs, 1)
    assert workloads.order(specs, 1) != workloads.order(specs, 2)
    assert sorted(s.body for s in workloads.order(specs, 3)) == sorted(s.body for s in specs)
