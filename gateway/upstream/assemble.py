"""Serving a non-streamed request from an upstream stream, so its acceptance can be measured.

A non-streamed response says nothing about engine steps; its streamed twin does (tokens per
chunk). For requests to the speculative pool the gateway therefore asks upstream for a stream with
continuous usage and builds the JSON body vLLM would have returned for the same request: the same
fields in the same order (vLLM 0.32's response models), the text joined from the deltas, usage
and ``metrics`` from the final chunks. The upstream generates the same tokens either way.

What cannot be rebuilt exactly passes through untouched (:func:`can_assemble` says no): ``n`` or
``best_of`` > 1, ``logprobs`` / ``top_logprobs`` / ``prompt_logprobs``, ``echo``,
``return_token_ids``, tools and function calls, prompts given as arrays (several choices or token
ids), a ``stream_options`` member (vLLM rejects it without ``stream``; the upstream should say so),
``kv_transfer_params``, and ``use_beam_search`` (vLLM refuses to stream a beam search).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.types import Api
from gateway.upstream.stream import encode_body

_NOT_ASSEMBLED = (
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "return_token_ids",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "stream_options",
    "kv_transfer_params",
    "use_beam_search",
)


def can_assemble(payload: Mapping[str, Any], api: Api) -> bool:
    for key in _NOT_ASSEMBLED:
        value = payload.get(key)
        # by identity: 0 == False, but ``logprobs: 0`` asks for the sampled tokens' log-probabilities
        if value is not None and value is not False:
            return False
    if payload.get("n") not in (None, 1) or payload.get("best_of") not in (None, 1):
        return False
    return api == "chat" or isinstance(payload.get("prompt"), str)


def stream_body(payload: Mapping[str, Any]) -> bytes:
    """The request body to send upstream: the same request, streamed with continuous usage."""
    return encode_body(
        {**payload, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )


def _usage(u: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {
        "prompt_tokens": u.get("prompt_tokens"),
        "total_tokens": u.get("total_tokens"),
        "completion_tokens": u.get("completion_tokens"),
        "prompt_tokens_details": u.get("prompt_tokens_details"),
        "completion_tokens_details": u.get("completion_tokens_details"),
    }


def assemble(chunks: Sequence[Mapping[str, Any]], api: Api) -> dict[str, Any] | None:
    """The non-streamed body equivalent to ``chunks`` (parsed ``data:`` events); ``None`` if empty."""
    if not chunks:
        return None
    first = chunks[0]
    texts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    # vLLM before 0.10 named the chain of thought ``reasoning_content``: the message keeps the stream's name
    reasoning_key = "reasoning"
    role: dict[int, str] = {}
    finish: dict[int, tuple[Any, Any]] = {}
    usage: Mapping[str, Any] | None = None
    fingerprint = None
    metrics = None
    for chunk in chunks:
        for c in chunk.get("choices") or ():
            i = c.get("index", 0)
            parts = texts.setdefault(i, [])
            if api == "chat":
                delta = c.get("delta") or {}
                if delta.get("role"):
                    role[i] = delta["role"]
                if delta.get("content"):
                    parts.append(delta["content"])
                r = delta.get("reasoning")
                if r is None and (r := delta.get("reasoning_content")) is not None:
                    reasoning_key = "reasoning_content"
                if r:
                    reasoning.setdefault(i, []).append(r)
            elif c.get("text"):
                parts.append(c["text"])
            if c.get("finish_reason") is not None:
                finish[i] = (c["finish_reason"], c.get("stop_reason"))
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        if chunk.get("system_fingerprint") is not None:
            fingerprint = chunk["system_fingerprint"]
        if chunk.get("metrics") is not None:
            metrics = chunk["metrics"]
    choices: list[dict[str, Any]] = []
    for i in sorted(texts):
        reason, stop = finish.get(i, (None, None))
        text = "".join(texts[i])
        if api == "chat":
            message = {
                "role": role.get(i, "assistant"),
                # a reasoning parser's answer that is all thinking has no content (null, not "")
                "content": None if not text and i in reasoning else text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                reasoning_key: "".join(reasoning[i]) if i in reasoning else None,
            }
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": stop,
                    "token_ids": None,
                    "routed_experts": None,
                }
            )
        else:
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": stop,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
            )
    body: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if api == "chat" else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": _usage(usage),
    }
    if api == "chat":
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=metrics)
    return body
