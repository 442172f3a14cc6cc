"""The emulator speaks vLLM 0.32's API: shapes checked against real captures, semantics against vLLM."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.emulator.conftest import (
    MODEL,
    OPEN_ENDED,
    STRUCTURED,
    Emu,
    fixture_error,
    fixture_events,
    fixture_json,
    keys,
)

GREEDY = {"model": MODEL, "temperature": 0}


def _choice_text(events: list[dict[str, Any]]) -> str:
    return "".join(
        c.get("text", c.get("delta", {}).get("content") or "") for e in events for c in e["choices"]
    )


# -- shapes against the captures ----------------------------------------------------------------


def test_completion_shape_matches_capture(spec: Emu) -> None:
    ref = fixture_json("nospec_completion.json")
    r = spec.post("/v1/completions", {**GREEDY, "prompt": STRUCTURED, "max_tokens": 8})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    got = r.json()
    assert keys(got) == keys(ref)
    assert keys(got["choices"][0]) == keys(ref["choices"][0])
    assert keys(got["usage"]) == keys(ref["usage"])
    assert got["object"] == "text_completion"
    assert got["id"].startswith("cmpl-") and len(got["id"]) == len("cmpl-") + 16
    int(got["id"][5:], 16)
    assert got["model"] == MODEL
    assert got["system_fingerprint"].startswith("vllm-0.32.0-")
    assert got["usage"]["completion_tokens"] == 8
    assert got["usage"]["total_tokens"] == got["usage"]["prompt_tokens"] + 8
    assert got["choices"][0]["finish_reason"] == "length"
    assert got["choices"][0]["token_ids"] is None and got["choices"][0]["prompt_token_ids"] is None


def test_chat_shape_matches_capture(spec: Emu) -> None:
    ref = fixture_json("nospec_chat.json")
    r = spec.post(
        "/v1/chat/completions", {**GREEDY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    )
    got = r.json()
    assert keys(got) == keys(ref)
    assert keys(got["choices"][0]) == keys(ref["choices"][0])
    assert keys(got["choices"][0]["message"]) == keys(ref["choices"][0]["message"])
    assert got["id"].startswith("chatcmpl-") and len(got["id"]) == len("chatcmpl-") + 16
    assert got["object"] == "chat.completion"
    assert got["choices"][0]["message"]["role"] == "assistant"
    assert got["usage"]["completion_tokens"] == 5


def test_models_and_health(spec: Emu) -> None:
    ref = fixture_json("nospec_models.json")
    got = spec.client.get(spec.url + "/v1/models").json()
    assert keys(got) == keys(ref)
    assert keys(got["data"][0]) == keys(ref["data"][0])
    assert keys(got["data"][0]["permission"][0]) == keys(ref["data"][0]["permission"][0])
    assert [m["id"] for m in got["data"]] == [MODEL]
    assert got["data"][0]["max_model_len"] == 1024
    h = spec.client.get(spec.url + "/health")
    assert h.status_code == 200 and h.content == b""


def test_completion_stream_shapes_match_capture(spec: Emu) -> None:
    ref = fixture_events("nospec_completion_stream_greedy_tokenids.sse")
    body = {
        **GREEDY,
        "prompt": STRUCTURED,
        "max_tokens": 24,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = spec.stream("/v1/completions", body)
    assert keys(events[-1]) == [*keys(ref[-1]), "metrics"]  # --per-request-spec-decode-metrics summary
    del events[-1]["metrics"]
    for got, want in ((events[0], ref[0]), (events[1], ref[1]), (events[-2], ref[-2]), (events[-1], ref[-1])):
        assert keys(got) == keys(want)
        if want["choices"]:
            assert keys(got["choices"][0]) == keys(want["choices"][0])
        assert keys(got["usage"]) == keys(want["usage"])
    assert events[-1]["choices"] == []
    assert events[0]["choices"][0]["prompt_token_ids"] and events[1]["choices"][0]["prompt_token_ids"] is None


def test_plain_stream_puts_fingerprint_on_last_chunk(base: Emu) -> None:
    ref = fixture_events("nospec_completion_stream_greedy.sse")
    events = base.stream("/v1/completions", {**GREEDY, "prompt": "hello", "max_tokens": 5})
    assert [keys(e) for e in (events[0], events[-1])] == [keys(ref[0]), keys(ref[-1])]
    assert "system_fingerprint" in events[-1] and events[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events)


def test_chat_stream_shapes_match_capture(spec: Emu) -> None:
    msgs = [{"role": "user", "content": OPEN_ENDED}]
    for fixture, opts in (
        ("nospec_chat_stream.sse", {"include_usage": True}),
        ("nospec_chat_stream_usage.sse", {"include_usage": True, "continuous_usage_stats": True}),
    ):
        ref = fixture_events(fixture)
        events = spec.stream("/v1/chat/completions", {**GREEDY, "messages": msgs, "max_tokens": 8,
                                                       "stream_options": opts})  # fmt: skip
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        events[-1].pop("metrics")
        for got, want in (
            (events[0], ref[0]),
            (events[1], ref[1]),
            (events[-2], ref[-2]),
            (events[-1], ref[-1]),
        ):
            assert keys(got) == keys(want), fixture
            if want["choices"]:
                assert keys(got["choices"][0]) == keys(want["choices"][0])
            if "usage" in want:
                assert keys(got["usage"]) == keys(want["usage"])
        assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_sse_headers(spec: Emu) -> None:
    with spec.client.stream(
        "POST", spec.url + "/v1/completions", json={**GREEDY, "prompt": "x", "stream": True}
    ) as r:
        r.read()
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert r.headers.get("transfer-encoding") == "chunked"


# -- errors -----------------------------------------------------------------------------------------


def test_unknown_model_404(spec: Emu) -> None:
    status, ref = fixture_error("error_unknown_model.txt")
    r = spec.post("/v1/completions", {"model": "nope", "prompt": "x"})
    assert r.status_code == status == 404
    err = r.json()["error"]
    assert keys(err) == keys(ref["error"])
    assert err["type"] == "NotFoundError" and err["param"] == "model" and err["code"] == 404
    assert err["message"] == f"The model `nope` does not exist. Valid aliases: {MODEL}."
    assert spec.post("/v1/chat/completions", {"model": "nope", "messages": []}).status_code == 404


def test_max_tokens_too_large_400(spec: Emu) -> None:
    status, ref = fixture_error("error_max_tokens_too_large.txt")
    for stream in (False, True):
        r = spec.post(
            "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5000, "stream": stream}
        )
        assert r.status_code == status
        assert r.json() == ref
    # prompt + max_tokens over the context
    r = spec.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1024})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_validation_errors_400(spec: Emu) -> None:
    status, ref = fixture_error("error_bad_json.txt")
    r = spec.client.post(spec.url + "/v1/completions", content=b'{"model": "demo-model", "prompt": ')
    assert r.status_code == status == 400
    err = r.json()["error"]
    assert keys(err) == keys(ref["error"])
    assert err["type"] == ref["error"]["type"] == "Bad Request"
    assert err["message"].startswith("1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.")
    assert err["param"].startswith("body.")
    for path, body, field in (
        ("/v1/completions", {"model": MODEL}, "body.prompt"),
        ("/v1/chat/completions", {"model": MODEL}, "body.messages"),
    ):
        r = spec.post(path, body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert (
            err["type"] == "Bad Request" and err["param"] == field and "'type': 'missing'" in err["message"]
        )
    r = spec.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body.max_tokens"
    r = spec.post("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2})
    assert r.status_code == 400 and r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }
    # what the emulator does not model is refused, never silently ignored
    for field, value in (("echo", True), ("best_of", 2), ("suffix", "end")):
        r = spec.post("/v1/completions", {"model": MODEL, "prompt": "x", field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field
        assert r.json()["error"]["message"] == f"{field} is not supported by this emulator."
    for field, value in (("echo", False), ("best_of", 1), ("best_of", None), ("suffix", None)):
        assert spec.post("/v1/completions", {"model": MODEL, "prompt": "x", field: value}).status_code == 200
    # a forced tool call is not modelled either: refused, where a plain answer would pass for one
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [tool], "max_tokens": 2}
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        r = spec.post("/v1/chat/completions", {**chat, "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert r.json()["error"]["message"] == "tool_choice is not supported by this emulator."
    for choice in ("auto", "none", None):
        assert spec.post("/v1/chat/completions", {**chat, "tool_choice": choice}).status_code == 200


def test_stream_options_without_stream_is_vllms_400_naming_the_field(spec: Emu) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "stream_options": {"include_usage": True}}
    r = spec.post("/v1/completions", body)
    assert r.status_code == 400 and r.json()["error"] == {
        "message": "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        "type": "BadRequestError",
        "param": "stream_options",
        "code": 400,
    }
    # vLLM's check reads the member as a truth value: an empty object passes
    assert spec.post("/v1/completions", {**body, "stream_options": {}}).status_code == 200


def test_min_p_and_logit_bias_are_refused_with_speculation_only(spec: Emu, base: Emu) -> None:
    refused = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
    for path, extra in (
        ("/v1/completions", {"min_p": 0.05}),
        ("/v1/chat/completions", {"logit_bias": {"5": -100}}),
    ):
        body = {"model": MODEL, "max_tokens": 2, **extra}
        body |= (
            {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
        )
        r = spec.post(path, body)
        assert r.status_code == 400 and r.json()["error"] == {
            "message": refused,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
        assert base.post(path, body).status_code == 200
    for off in (
        {"min_p": 0},
        {"logit_bias": {}},
        {"min_p": None, "logit_bias": None},
        {"min_p": 0.1, "temperature": 0},
    ):
        assert (
            spec.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, **off}).status_code
            == 200
        )


# -- semantics --------------------------------------------------------------------------------------


def test_defaults_max_tokens(zero: Emu) -> None:
    r = zero.post("/v1/completions", {**GREEDY, "prompt": "Tell me a story"}).json()
    assert r["usage"]["completion_tokens"] == 16  # vLLM's completions default
    r = zero.post(
        "/v1/chat/completions", {**GREEDY, "messages": [{"role": "user", "content": "Tell me a story"}]}
    )
    usage = r.json()["usage"]
    assert usage["total_tokens"] == 1024  # chat: the rest of the context
    r = zero.post("/v1/completions", {"prompt": "no model field", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["model"] == MODEL


def test_determinism_at_temperature_zero(spec: Emu, base: Emu) -> None:
    body = {**GREEDY, "prompt": STRUCTURED, "max_tokens": 40, "return_token_ids": True}
    runs = [spec.stream("/v1/completions", body) for _ in range(2)]
    chunks = [[(c["choices"][0]["text"], c["choices"][0]["token_ids"]) for c in run] for run in runs]
    assert chunks[0] == chunks[1]
    plain = [spec.post("/v1/completions", body).json()["choices"][0] for _ in range(2)]
    assert plain[0]["text"] == plain[1]["text"] == _choice_text(runs[0])
    assert plain[0]["token_ids"] == plain[1]["token_ids"]
    # same model, same greedy output with or without speculation
    assert base.post("/v1/completions", body).json()["choices"][0]["text"] == plain[0]["text"]
    # seeded sampling is reproducible too; unseeded sampling is not
    sampled = {**body, "temperature": 1.0, "seed": 7, "prompt": OPEN_ENDED, "max_tokens": 12}
    a, b = (spec.post("/v1/completions", sampled).json()["choices"][0]["text"] for _ in range(2))
    assert a == b
    unseeded = {**sampled, "seed": None}
    texts = {spec.post("/v1/completions", unseeded).json()["choices"][0]["text"] for _ in range(3)}
    assert len(texts) > 1


def test_tokens_per_chunk_speculative_vs_baseline(spec: Emu, base: Emu) -> None:
    body = {**GREEDY, "prompt": STRUCTURED, "max_tokens": 48, "return_token_ids": True}
    spec_sizes = [len(e["choices"][0]["token_ids"]) for e in spec.stream("/v1/completions", body)]
    base_sizes = [len(e["choices"][0]["token_ids"]) for e in base.stream("/v1/completions", body)]
    assert sum(spec_sizes) == sum(base_sizes) == 48
    assert set(base_sizes) == {1}
    assert spec_sizes[0] == 1  # the prefill step gives one token
    assert max(spec_sizes) > 1 and max(spec_sizes) <= 8  # at most k + 1
    assert sum(spec_sizes) / len(spec_sizes) > 2.5


def test_stop_strings(spec: Emu) -> None:
    body = {**GREEDY, "prompt": "Repeat this line 50 times: alpha beta gamma", "max_tokens": 60}
    full = spec.post("/v1/completions", body).json()["choices"][0]["text"]
    assert "gamma" in full
    r = spec.post("/v1/completions", {**body, "stop": ["gamma"]}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["stop_reason"] == "gamma"
    assert r["text"] == full[: full.index("gamma")]
    events = spec.stream("/v1/completions", {**body, "stop": "gamma"})
    assert _choice_text(events) == r["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["stop_reason"] == "gamma"
    r = spec.post("/v1/completions", {**body, "stop": ["gamma"], "include_stop_str_in_output": True}).json()
    assert r["choices"][0]["text"].endswith("gamma")


def test_include_usage_only_final(base: Emu) -> None:
    body = {**GREEDY, "prompt": OPEN_ENDED, "max_tokens": 6, "stream_options": {"include_usage": True}}
    events = base.stream("/v1/completions", body)
    assert all("usage" not in e for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6
    assert "system_fingerprint" in events[-1] and "system_fingerprint" not in events[-2]


def test_continuous_usage_and_token_ids(spec: Emu) -> None:
    body = {
        **GREEDY,
        "prompt": STRUCTURED,
        "max_tokens": 30,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = spec.stream("/v1/completions", body)
    total = 0
    for e in events[:-1]:
        total += len(e["choices"][0]["token_ids"])
        assert e["usage"]["completion_tokens"] == total
    assert events[-1]["usage"]["completion_tokens"] == total == 30
    prompt_ids = events[0]["choices"][0]["prompt_token_ids"]
    assert len(prompt_ids) == events[-1]["usage"]["prompt_tokens"] and prompt_ids[0] == 1
    plain = spec.post("/v1/completions", body | {"stream": False, "stream_options": None}).json()
    assert plain["choices"][0]["prompt_token_ids"] == prompt_ids
    assert plain["choices"][0]["token_ids"] == [t for e in events[:-1] for t in e["choices"][0]["token_ids"]]


def test_chat_continuous_usage(spec: Emu) -> None:
    body = {
        **GREEDY,
        "messages": [{"role": "user", "content": "Continue the sequence: 1, 2, 3, 4"}],
        "max_tokens": 20,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = spec.stream("/v1/chat/completions", body)
    assert events[0]["usage"]["completion_tokens"] == 0
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 20
    assert "5, 6, 7" in _choice_text(events)


def test_prompt_list(spec: Emu) -> None:
    body = {**GREEDY, "prompt": [STRUCTURED, OPEN_ENDED], "max_tokens": 10}
    r = spec.post("/v1/completions", body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"]["completion_tokens"] == 20
    single = spec.post("/v1/completions", {**GREEDY, "prompt": OPEN_ENDED, "max_tokens": 10}).json()
    assert r["choices"][1]["text"] == single["choices"][0]["text"]
    events = spec.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert {c["index"] for e in events for c in e["choices"]} == {0, 1}
    assert events[-1]["usage"]["completion_tokens"] == 20


def test_logprobs(spec: Emu) -> None:
    r = spec.post("/v1/completions", {**GREEDY, "prompt": "x", "max_tokens": 4, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert keys(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert len(lp["tokens"]) == 4 and all(len(t) == 2 for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    r = spec.post(
        "/v1/chat/completions",
        {
            **GREEDY,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "logprobs": True,
            "top_logprobs": 1,
        },
    ).json()
    assert len(r["choices"][0]["logprobs"]["content"]) == 3


def test_per_request_spec_decode_metrics(spec: Emu, base: Emu) -> None:
    body = {**GREEDY, "prompt": STRUCTURED, "max_tokens": 40}
    m = spec.post("/v1/completions", body).json()["metrics"]["speculative_decoding"]
    assert keys(m) == [
        "mean_acceptance_length",
        "draft_acceptance_rate",
        "num_spec_steps",
        "num_draft_tokens",
        "num_accepted_draft_tokens",
    ]
    assert m["num_draft_tokens"] == 7 * m["num_spec_steps"]
    assert m["num_accepted_draft_tokens"] <= m["num_draft_tokens"]
    assert m["mean_acceptance_length"] > 2.5
    assert (
        abs(m["mean_acceptance_length"] - (1 + m["num_accepted_draft_tokens"] / m["num_spec_steps"])) < 1e-9
    )
    events = spec.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1]["metrics"]["speculative_decoding"] == m  # deterministic at T=0
    assert base.post("/v1/completions", body).json()["metrics"] is None


def test_vllm_xargs_emulated_acceptance(spec: Emu) -> None:
    body = {**GREEDY, "prompt": STRUCTURED, "max_tokens": 40}
    zero = spec.post("/v1/completions", {**body, "vllm_xargs": {"emulated_acceptance": 0.0}}).json()
    assert zero["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 0
    high = spec.post("/v1/completions", {**OPEN_BODY, "vllm_xargs": {"emulated_acceptance": 0.95}}).json()
    assert high["metrics"]["speculative_decoding"]["mean_acceptance_length"] > 4
    bad = spec.post("/v1/completions", {**body, "vllm_xargs": {"emulated_acceptance": 3}})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"


OPEN_BODY = {**GREEDY, "prompt": OPEN_ENDED, "max_tokens": 40}


def test_control_endpoint_lowers_acceptance(spec: Emu) -> None:
    body = {**GREEDY, "prompt": STRUCTURED + " (control)", "max_tokens": 60}
    before = spec.post("/v1/completions", body).json()["metrics"]["speculative_decoding"]
    try:
        state = spec.control(acceptance_scale=0.3)
        assert state["settings"]["acceptance_scale"] == 0.3
        after = spec.post("/v1/completions", body).json()["metrics"]["speculative_decoding"]
    finally:
        spec.control(acceptance_scale=1.0)
    assert after["draft_acceptance_rate"] < before["draft_acceptance_rate"] / 2
    assert after["mean_acceptance_length"] < 2.0 < before["mean_acceptance_length"]
    r = spec.client.post(spec.url + "/emulator/control", json={"error_rate": 2})
    assert r.status_code == 400
    r = spec.client.post(spec.url + "/emulator/control", json={"nonsense": 1})
    assert r.status_code == 400


def test_temperature_lowers_acceptance(spec: Emu) -> None:
    body = {"model": MODEL, "prompt": STRUCTURED, "max_tokens": 80, "seed": 1}
    cold = spec.post("/v1/completions", {**body, "temperature": 0}).json()["metrics"]["speculative_decoding"]
    hot = spec.post("/v1/completions", {**body, "temperature": 1.5}).json()["metrics"]["speculative_decoding"]
    assert hot["draft_acceptance_rate"] < cold["draft_acceptance_rate"]


def test_state_endpoint(spec: Emu) -> None:
    st = spec.state()
    assert st["mode"] == "speculative"
    assert st["settings"]["num_speculative_tokens"] == 7
    assert st["counters"]["requests"] >= 1
    assert {"running", "waiting", "aborted", "num_drafts", "num_accepted_tokens"} <= set(st["counters"])


def test_client_disconnect_aborts(base: Emu) -> None:
    def running() -> float:
        return base.state()["counters"]["running"]

    aborted = base.state()["counters"]["aborted"]
    body = {**GREEDY, "prompt": OPEN_ENDED, "max_tokens": 900, "stream": True}
    with httpx.Client(timeout=10) as c, c.stream("POST", base.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        assert running() == 1
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)
    st = base.state()["counters"]
    assert st["running"] == 0 and st["aborted"] == aborted + 1
    assert st["finished_by_reason"]["abort"] >= 1
    # a non-streamed request is aborted too when its client gives up
    with pytest.raises(httpx.ReadTimeout):
        base.client.post(base.url + "/v1/completions", json={**body, "stream": False}, timeout=0.3)
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)
    st = base.state()["counters"]
    assert st["running"] == 0 and st["aborted"] == aborted + 2
