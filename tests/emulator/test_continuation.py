"""A greedy answer is a function of its context: continuing from the start of the emulator's own
answer gives the rest of it, on either pool, as a real model does (what stream resumption needs)."""

from __future__ import annotations

import pytest

from gateway.emulator.tokenizer import pieces
from tests.emulator.conftest import MODEL, Emu

GREEDY = {"model": MODEL, "temperature": 0}
PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a python function that merges two sorted lists.",
    "Summarise: the committee met on Tuesday and agreed to move the budget vote to next month",
    # ends on a newline: the answer starts without a space, and "dog" + "the" would be one token
    "Repeat this line 50 times: the quick brown fox jumps over the lazy dog\n",
)


def _text(emu: Emu, prompt: str, max_tokens: int) -> str:
    r = emu.post("/v1/completions", {**GREEDY, "prompt": prompt, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("cut", [1, 9, 30])
def test_completion_continues_its_own_answer(spec: Emu, base: Emu, prompt: str, cut: int) -> None:
    full = _text(spec, prompt, 48)
    said = "".join(pieces(full)[:cut])
    rest = _text(base, prompt + said, 48 - cut)
    assert said + rest == full


def test_other_text_is_not_a_continuation(spec: Emu) -> None:
    prompt = PROMPTS[0]
    full = _text(spec, prompt, 24)
    # a context that merely ends like the answer, without the answer's start, is answered afresh
    foreign = prompt + " Once upon a time"
    assert _text(spec, foreign, 24) not in full
    # sampled output is not continued: its start is not a function of the prompt alone
    said = "".join(pieces(full)[:6])
    r = spec.post("/v1/completions", {**GREEDY, "temperature": 1.0, "seed": 3, "prompt": prompt + said})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] != full[len(said) :][:16]


def _chat(emu: Emu, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> dict:
    body = {**GREEDY, "messages": messages, "max_tokens": max_tokens, **extra}
    r = emu.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    out: dict = r.json()
    return out


def test_chat_continue_final_message(spec: Emu, base: Emu) -> None:
    messages = [{"role": "user", "content": PROMPTS[1]}]
    full = _chat(spec, messages, 40)["choices"][0]["message"]["content"]
    said = "".join(pieces(full)[:11])
    cont = _chat(
        base,
        [*messages, {"role": "assistant", "content": said}],
        29,
        continue_final_message=True,
        add_generation_prompt=False,
    )
    assert said + cont["choices"][0]["message"]["content"] == full
    # the open message is part of the prompt, rendered after the same "<im_start> assistant \\n"
    first = _chat(spec, messages, 1)["usage"]["prompt_tokens"]
    assert cont["usage"]["prompt_tokens"] == first + 11  # the open message: no <im_end> after it


def test_chat_continue_final_message_needs_no_generation_prompt(spec: Emu) -> None:
    body = {
        **GREEDY,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
        "continue_final_message": True,
    }
    r = spec.post("/v1/chat/completions", body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "Cannot set both `continue_final_message` and `add_generation_prompt`" in message
