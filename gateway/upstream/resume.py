"""Resuming a stream that broke after the client had part of it, on another endpoint.

Both pools serve the same model, so a generation cut short by a dead endpoint, a reset connection
or a silent one can go on elsewhere from what the client already has: the prompt plus the text sent
so far is a context whose greedy continuation is the rest of the answer. The client sees one stream:
the resumed chunks carry the first response's ``id``, ``created`` and ``model``, chat's role chunk
is not repeated, and token counts in ``usage`` are summed (the prompt is the client's own).

* completions continue from ``prompt`` + text sent, or, when the stream carries token ids (the
  client asked for ``return_token_ids``), from the prompt's token ids + the answer's. The ids are
  exact: they are the very context the model was in. Text is re-tokenised, which gives the same
  tokens except where the tokenizer would merge the last token sent with the next one (a cut inside
  a word, or a prompt ending where the answer starts without a space); the continuation is then
  still a valid one, just not necessarily the same (a byte-level tokenizer whose text holds half a
  character never round-trips). With ``retries.resume_with_token_ids`` the gateway asks for the
  ids itself and cuts them out of the chunks again; off by default, as that rewrites every chunk of
  every resumable completion stream.
* chat continues the partial assistant message: ``messages`` + ``{"role": "assistant", "content":
  <text sent>}`` with ``continue_final_message: true`` and ``add_generation_prompt: false``; the
  chat template renders that message open, and its text is re-tokenised as above (vLLM's chat API
  takes no token ids).
* ``max_tokens`` / ``max_completion_tokens`` / ``min_tokens`` shrink by the tokens already sent;
  ``stop`` and every other option go along unchanged.

Greedy decoding (temperature 0) resumes to exactly the text an unbroken run gives. Sampled output
resumes to a valid continuation of what was sent, drawn afresh; a ``seed`` does not make it
reproducible. Frequency and presence penalties, which count only the answer's own tokens, restart
with the continuation.

Not resumed (the stream ends with an error event, as before): several choices (``n``, ``best_of``,
several prompts), ``logprobs`` (the alternatives of the sent tokens cannot be re-sent), ``echo``,
``suffix``, guided decoding and JSON / structured ``response_format`` (the grammar would restart
inside the prefix), a stop string of two or more characters (the upstream holds back the text that
could start one, so the text sent ends inside a token: see :func:`_holds_back`), a required or
named ``tool_choice``, a stream that has sent tool-call or
reasoning deltas (they cannot be put back into the context as the model produced them) or a
finish reason, and a prompt of token ids whose stream carries no ids to extend it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.upstream.pool import Endpoint
from gateway.upstream.sse import EventBuffer, data_object
from gateway.upstream.stream import request_usage

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")


def refusal(payload: dict[str, Any], chat: bool) -> str | None:
    """Why a request could not be resumed whatever it streams, or None."""
    if payload.get("n") not in (None, 1) or payload.get("best_of") not in (None, 1):
        return "several choices"
    if payload.get("echo") or payload.get("suffix") or payload.get("prompt_logprobs") is not None:
        return "echo, suffix or prompt logprobs"
    if chat:
        if payload.get("logprobs") or payload.get("top_logprobs"):
            return "logprobs"
        choice = payload.get("tool_choice")
        if choice == "required" or isinstance(choice, dict):
            return "forced tool call"
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages"
        last = messages[-1]
        if payload.get("continue_final_message") and not (
            isinstance(last, dict) and isinstance(last.get("content"), str)
        ):
            return "final message without text content"
    else:
        if payload.get("logprobs") is not None:
            return "logprobs"
        prompt = payload.get("prompt")
        if not (isinstance(prompt, str) or _one_text(prompt) or _ids(prompt)):
            return "several prompts"
    if _holds_back(payload.get("stop")):
        return "a stop string of two or more characters"
    fmt = payload.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "structured response_format"
    if any(payload.get(k) is not None for k in _GUIDED):
        return "guided decoding"
    return None


def _holds_back(stop: Any) -> bool:
    """Whether the upstream holds back streamed text for ``stop``: one of two or more characters.

    vLLM keeps the last ``len - 1`` characters of the text back on every chunk, in case a stop string
    is forming (the tokens are generated and counted, their text not sent), so the text a client has
    ends inside a token more often than not: continued from there the answer differs, and
    ``max_tokens`` would shrink by tokens whose text is regenerated. Such a stream ends with the
    error event rather than with an answer that reads whole and is not the model's.
    """
    if isinstance(stop, str):
        return len(stop) > 1
    if isinstance(stop, list):
        return any(isinstance(s, str) and len(s) > 1 for s in stop[:64])
    return False


def _one_text(prompt: Any) -> bool:
    return isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)


def _ids(prompt: Any) -> bool:
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )


# the keys of a chat delta that carries text and nothing the transcript must react to
_TEXT_ONLY = frozenset(("content",))


@dataclass(slots=True)
class Transcript:
    """What the client has been sent of one streamed response (recorded by the stream meter)."""

    id: Any = None
    created: Any = None
    model: Any = None
    system_fingerprint: Any = None
    text: list[str] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    role_sent: bool = False
    blocked: str | None = None

    def record(self, chunk: dict[str, Any]) -> None:
        """Take one chunk as it goes to the client."""
        if self.id is None:
            self.id, self.created, self.model = chunk.get("id"), chunk.get("created"), chunk.get("model")
        if chunk.get("system_fingerprint") is not None and self.system_fingerprint is None:
            self.system_fingerprint = chunk["system_fingerprint"]
        top_ids = chunk.get("prompt_token_ids")
        if isinstance(top_ids, list) and self.prompt_token_ids is None:
            self.prompt_token_ids = top_ids
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int) and self.prompt_tokens is None:
                self.prompt_tokens = usage["prompt_tokens"]
        for c in chunk.get("choices") or ():
            if not isinstance(c, dict):
                continue
            if c.get("index", 0) != 0:
                self.blocked = "several choices"
            if c.get("finish_reason") is not None:
                self.blocked = "finished"
            delta = c.get("delta")
            if isinstance(delta, dict):
                # most deltas hold text only: one C-level test of their keys instead of five lookups
                if not _TEXT_ONLY.issuperset(delta):
                    if delta.get("role"):
                        self.role_sent = True
                    if delta.get("tool_calls") or delta.get("function_call"):
                        self.blocked = "tool call in flight"
                    if delta.get("reasoning") or delta.get("reasoning_content"):
                        self.blocked = "reasoning in flight"
                content = delta.get("content")
                if isinstance(content, str):
                    self.text.append(content)
            elif isinstance(c.get("text"), str):
                self.text.append(c["text"])
            if isinstance(c.get("prompt_token_ids"), list) and self.prompt_token_ids is None:
                self.prompt_token_ids = c["prompt_token_ids"]
            ids = c.get("token_ids")
            if isinstance(ids, list):
                # extended in place: a new list per chunk made a long stream's recording quadratic
                if self.token_ids is None:
                    self.token_ids = []
                self.token_ids.extend(ids)


@dataclass(slots=True)
class Resumption:
    """One streamed request that may be resumed: what to send again, and what happened."""

    chat: bool
    path: str
    payload: dict[str, Any]
    headers: dict[str, str]
    transcript: Transcript = field(default_factory=Transcript)
    strip_token_ids: bool = False  # the gateway asked for the token ids, not the client
    attempts_used: int = 0  # upstream tries so far, the first response's included
    broken: list[Endpoint] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)  # where the stream went on
    failover: bool = True  # whether it may go on in the other pool (not when only its own serves it)

    def upstream_payload(self, with_token_ids: bool) -> dict[str, Any]:
        """The request to send first: a completion asks for token ids when ``with_token_ids``."""
        if self.chat or not with_token_ids or self.payload.get("return_token_ids"):
            return self.payload
        self.strip_token_ids = True
        return {**self.payload, "return_token_ids": True}

    def body(self) -> bytes | None:
        """The continuation request, or None when this stream cannot be continued."""
        t = self.transcript
        if t.blocked is not None:
            return None
        payload = dict(self.payload)
        text = "".join(t.text)
        if self.chat:
            if text:
                messages = list(payload["messages"])
                last = messages[-1]
                if payload.get("continue_final_message") and last.get("role") == "assistant":
                    messages[-1] = {**last, "content": last["content"] + text}
                else:
                    messages.append({"role": "assistant", "content": text})
                payload["messages"] = messages
                payload["continue_final_message"] = True
                payload["add_generation_prompt"] = False
        else:
            prompt = payload.get("prompt")
            if t.token_ids is not None and t.prompt_token_ids is not None:
                payload["prompt"] = t.prompt_token_ids + t.token_ids
                if self.strip_token_ids:
                    payload["return_token_ids"] = True
            elif isinstance(prompt, str):
                payload["prompt"] = prompt + text
            elif isinstance(prompt, list) and _one_text(prompt):
                payload["prompt"] = prompt[0] + text
            else:
                return None
            payload.setdefault("max_tokens", 16)  # vLLM's default for completions
        sent = t.completion_tokens
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(payload.get(key), int):
                payload[key] -= sent
                if payload[key] < 1:
                    return None
        if isinstance(payload.get("min_tokens"), int):
            payload["min_tokens"] = max(0, payload["min_tokens"] - sent)
        return request_usage(payload)[0]

    def splice(self) -> Splice:
        t = self.transcript
        return Splice(t, self.chat, t.completion_tokens, t.prompt_tokens)


class Splice:
    """Rewrites a continuation stream into the rest of the first one.

    Events are framed by :mod:`gateway.upstream.sse`; a ``data:`` JSON event is re-encoded with the first
    response's identity, summed token counts and without the continuation's own prompt ids or
    per-request ``metrics`` (and, for chat, without its role chunk). ``[DONE]`` and anything else pass
    as they are.
    """

    __slots__ = ("_sse", "chat", "prompt_tokens", "sent_tokens", "transcript")

    def __init__(self, transcript: Transcript, chat: bool, sent_tokens: int, prompt_tokens: int | None):
        self.transcript = transcript
        self.chat = chat
        self.sent_tokens = sent_tokens
        self.prompt_tokens = prompt_tokens
        self._sse = EventBuffer()

    def feed(self, raw: bytes) -> bytes:
        events, _ = self._sse.feed(raw)
        out = []
        for event in events:
            kept = self._event(event)
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        obj = data_object(self._sse.data(event))
        if obj is None or "error" in obj:
            return event
        t = self.transcript
        for key in ("id", "created", "model"):
            if key in obj and getattr(t, key) is not None:
                obj[key] = getattr(t, key)
        if obj.get("system_fingerprint") is not None and t.system_fingerprint is not None:
            obj["system_fingerprint"] = t.system_fingerprint
        if obj.get("prompt_token_ids") is not None:
            obj["prompt_token_ids"] = None
        if obj.get("metrics") is not None:
            # the server's per-request summary (speculative decoding's steps and drafts) covers the
            # continuation only, while usage is summed: none rather than one at odds with the usage
            obj["metrics"] = None
        for c in obj.get("choices") or ():
            if not isinstance(c, dict):
                continue
            if c.get("prompt_token_ids") is not None:
                c["prompt_token_ids"] = None
            delta = c.get("delta")
            if self.chat and isinstance(delta, dict) and "role" in delta and t.role_sent:
                if not delta.get("content") and c.get("finish_reason") is None and len(delta) <= 2:
                    return None  # the role chunk again: the client has it
                del delta["role"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += self.sent_tokens
            if self.prompt_tokens is not None:
                usage["prompt_tokens"] = self.prompt_tokens
            if isinstance(usage.get("completion_tokens"), int) and isinstance(
                usage.get("prompt_tokens"), int
            ):
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return self._sse.with_data(event, orjson.dumps(obj))
