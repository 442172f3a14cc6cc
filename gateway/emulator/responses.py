"""vLLM's Responses API (``POST /v1/responses``): the request read as a chat, the answer in its shape.

A Responses request is a chat in other words: ``instructions`` is the system message, ``input`` a
string (one user message) or a list of message items, ``max_output_tokens`` the output limit and
``text.format`` the structured-output format. It is generated like a chat; the answer is one
``message`` output item. A stream is vLLM's sequence of named events (``event:`` and ``data:`` lines,
no ``[DONE]``): ``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per engine output, then the
``.done`` events and ``response.completed`` with the whole response and its usage.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.engine import Seq
from gateway.emulator.protocol import GenRequest, parse_request, validation_error

_COPIED = (
    "model",
    "stream",
    "temperature",
    "top_p",
    "seed",
    "text",
    "structured_outputs",
    "vllm_xargs",
    "min_p",
    "logit_bias",
)


def parse_responses_request(d: dict[str, Any], cfg: EmulatorConfig) -> GenRequest:
    """Validate a Responses request like vLLM and read it as the chat it amounts to."""
    if "input" not in d:
        raise validation_error("missing", ["body", "input"], "Field required", d)
    messages: list[dict[str, Any]] = []
    instructions = d.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise validation_error(
                "string_type", ["body", "instructions"], "Input should be a valid string", d
            )
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(d["input"]))
    chat: dict[str, Any] = {k: d[k] for k in _COPIED if k in d}
    chat["messages"] = messages
    if d.get("max_output_tokens") is not None:
        chat["max_tokens"] = d["max_output_tokens"]
    return parse_request(True, chat, cfg)


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise validation_error("string_type", ["body", "input"], "Input should be a valid string", value)
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise validation_error(
                "dict_type", ["body", "input", i], "Input should be a valid dictionary", item
            )
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            out.append({"role": item.get("role", "user"), "content": _content(item.get("content"))})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": str(item.get("output", ""))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": str(item.get("arguments", ""))})
    if not out:
        raise validation_error("too_short", ["body", "input"], "Input should have at least 1 message", value)
    return out


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _event(kind: str, body: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({**body, "type": kind}) + b"\n\n"


class ResponsesResponder:
    """Builds the body and the stream events of one Responses request (the chat responder's interface)."""

    __slots__ = ("created", "item_id", "req", "rid", "seq_no", "source")

    def __init__(self, req: GenRequest, rid: str, item_id: str, created: int, source: dict[str, Any]) -> None:
        self.req = req
        self.rid = rid
        self.item_id = item_id
        self.created = created
        self.source = source  # the request, for the fields the response echoes
        self.seq_no = 0

    def _next(self) -> int:
        n = self.seq_no
        self.seq_no += 1
        return n

    def _part(self, text: str) -> dict[str, Any]:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}

    def _item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [self._part(text)]
        return {
            "id": self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
        }

    def response(self, seqs: list[Seq] | None) -> dict[str, Any]:
        """The response object: in progress (no output yet) or finished."""
        src, req = self.source, self.req
        status, usage, output, incomplete = "in_progress", None, [], None
        if seqs is not None:
            s = seqs[0]
            status = "incomplete" if s.finish_reason == "length" else "completed"
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            output = [self._item(s.full_text(), "completed")]
            n_out = len(s.out_ids)
            usage = {
                "input_tokens": s.prompt_len,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": s.prompt_len + n_out,
            }
        return {
            "id": self.rid,
            "created_at": self.created,
            "incomplete_details": incomplete,
            "instructions": src.get("instructions"),
            "metadata": src.get("metadata"),
            "model": req.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": src.get("parallel_tool_calls", True),
            "temperature": req.temperature,
            "tool_choice": src.get("tool_choice", "auto"),
            "tools": src.get("tools") or [],
            "top_p": src.get("top_p", 1.0),
            "background": False,
            "max_output_tokens": req.max_tokens,
            "max_tool_calls": None,
            "previous_response_id": src.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": src.get("text"),
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage,
            "user": src.get("user"),
        }

    def full(self, seqs: list[Seq]) -> bytes:
        return orjson.dumps(self.response(seqs))

    def chunk(self, seq: Seq, start: int, end: int, delta: str, finished: bool, last: bool) -> bytes:
        out = b""
        if start == 0:
            opening = self.response(None)
            out += _event("response.created", {"response": opening, "sequence_number": self._next()})
            out += _event("response.in_progress", {"response": opening, "sequence_number": self._next()})
            out += _event(
                "response.output_item.added",
                {"item": self._item(None, "in_progress"), "output_index": 0, "sequence_number": self._next()},
            )
            out += _event(
                "response.content_part.added",
                {
                    "content_index": 0,
                    "item_id": self.item_id,
                    "output_index": 0,
                    "part": self._part(""),
                    "sequence_number": self._next(),
                },
            )
        if delta:
            out += _event(
                "response.output_text.delta",
                {
                    "content_index": 0,
                    "delta": delta,
                    "item_id": self.item_id,
                    "logprobs": [],
                    "output_index": 0,
                    "sequence_number": self._next(),
                },
            )
        return out

    def tail(self, seqs: list[Seq]) -> bytes:
        text = seqs[0].full_text()
        common = {"content_index": 0, "item_id": self.item_id, "output_index": 0}
        out = _event(
            "response.output_text.done",
            {**common, "logprobs": [], "text": text, "sequence_number": self._next()},
        )
        out += _event(
            "response.content_part.done",
            {**common, "part": self._part(text), "sequence_number": self._next()},
        )
        out += _event(
            "response.output_item.done",
            {"item": self._item(text, "completed"), "output_index": 0, "sequence_number": self._next()},
        )
        final = self.response(seqs)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + _event(kind, {"response": final, "sequence_number": self._next()})
