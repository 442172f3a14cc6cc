"""vLLM 0.32's OpenAI wire format: request validation, error bodies, responses and stream chunks.

Field names, order and ``null`` placeholders follow captures of a real vLLM 0.32.0 server (see
``tests/fixtures/vllm``).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.engine import Seq
from gateway.emulator.structured import Constraint, ConstraintError, from_request
from gateway.emulator.textgen import WORDS
from gateway.emulator.tokenizer import VOCAB_SIZE, encode_chat, encode_prompt

VLLM_VERSION = "0.32.0"
MAX_LOGPROBS = 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, param, status)


def error_body(message: str, type_: str, param: str | None, code: int) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


SAMPLING_EPS = 1e-5  # vLLM's tolerance for a sampling parameter that is "off"


def bad_request(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def _summarise(value: Any) -> Any:
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return value


def validation_error(
    kind: str, loc: list[str | int], msg: str, value: Any, ctx: dict[str, Any] | None = None
) -> ApiError:
    """A FastAPI request-validation error, rendered the way vLLM 0.32 renders it."""
    where = ".".join(str(p) for p in loc)
    detail: dict[str, Any] = {"type": kind, "loc": where, "msg": msg, "input": _summarise(value)}
    if ctx:
        detail["ctx"] = ctx
    return ApiError(400, f"1 validation error:\n  {detail!r}", "Bad Request", where)


_TYPE_MSGS = {
    "int_type": "Input should be a valid integer",
    "float_type": "Input should be a valid number",
    "bool_type": "Input should be a valid boolean",
    "string_type": "Input should be a valid string",
    "list_type": "Input should be a valid list",
    "dict_type": "Input should be a valid dictionary",
}


def _type_error(kind: str, name: str, value: Any) -> ApiError:
    return validation_error(kind, ["body", name], _TYPE_MSGS[kind], value)


def parse_json(body: bytes) -> dict[str, Any]:
    if not body:
        raise validation_error("missing", ["body"], "Field required", None)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            json.loads(body)
            pos, msg = 0, "Invalid JSON"
        except json.JSONDecodeError as e:
            pos, msg = e.pos, e.msg
        except UnicodeDecodeError:
            pos, msg = 0, "Invalid UTF-8"
        raise validation_error(
            "json_invalid", ["body", pos], "JSON decode error", {}, {"error": msg}
        ) from None
    if not isinstance(data, dict):
        raise validation_error(
            "model_attributes_type",
            ["body"],
            "Input should be a valid dictionary or object to extract fields from",
            data,
        )
    return data


# vLLM's request models read a scalar sent as a string as pydantic's lax mode does ("8", "0.5", "false")
_LAX_INT, _LAX_FLOAT, _LAX_BOOL = TypeAdapter(int), TypeAdapter(float), TypeAdapter(bool)


def _lax(adapter: TypeAdapter[Any], v: Any) -> Any:
    """``v`` as vLLM reads a scalar for the field's type ("8", 1 for a boolean, true for a number); ``v``
    itself where it reads none."""
    if isinstance(v, str | int | float):
        try:
            return adapter.validate_python(v)
        except ValidationError:
            return v
    return v


def _get_int(d: dict[str, Any], name: str, default: int | None) -> int | None:
    v = _lax(_LAX_INT, d.get(name, default))
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise _type_error("int_type", name, v)
    return int(v)


def _get_float(d: dict[str, Any], name: str, default: float | None) -> float | None:
    v = _lax(_LAX_FLOAT, d.get(name, default))
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _type_error("float_type", name, v)
    return float(v)


def _get_bool(d: dict[str, Any], name: str, default: bool) -> bool:
    v = _lax(_LAX_BOOL, d.get(name, default))
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _type_error("bool_type", name, v)
    return v


@dataclass(slots=True)
class Prompt:
    text: str  # what decides alpha and the generated text
    ids: tuple[int, ...]
    # A chat whose last (assistant) message is left open: the conversation before it, and that
    # message's text, which the model continues when it is the start of its own answer.
    origin: Prompt | None = None
    said: str = ""


@dataclass(slots=True)
class GenRequest:
    chat: bool
    model: str
    prompts: list[Prompt]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    max_tokens: int | None  # None: up to the context length
    temperature: float
    seed: int | None
    stops: list[str]
    include_stop: bool
    return_token_ids: bool
    logprobs: int | None  # completions: top-n; chat: top_logprobs (when logprobs=true)
    emulated_acceptance: float | None
    constraint: Constraint | None = None  # structured output: the answer is this JSON value or choice


def _stream_options(d: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    so = d.get("stream_options")
    if so and not stream:
        # vLLM 0.32's model validator, run before the fields are checked: an error naming the field
        raise bad_request(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        )
    if so is None:
        return False, False
    if not isinstance(so, dict):
        raise _type_error("dict_type", "stream_options", so)
    include = _lax(_LAX_BOOL, so.get("include_usage", False))
    cont = _lax(_LAX_BOOL, so.get("continuous_usage_stats", False))
    if not isinstance(include, bool) or not isinstance(cont, bool):
        raise validation_error(
            "bool_type", ["body", "stream_options", "include_usage"], _TYPE_MSGS["bool_type"], so
        )
    return bool(include), bool(include and cont)


def _stops(d: dict[str, Any]) -> list[str]:
    stop = d.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise _type_error("string_type", "stop", stop)


def _unsupported(chat: bool, d: dict[str, Any]) -> str | None:
    """A completion field that would change vLLM's answer but that the emulator does not model, if set:
    refused like ``n > 1`` rather than ignored, so that no answer looks right and is not."""
    if chat:
        # a forced tool call (vLLM constrains the answer to the tool's arguments) is not modelled; with
        # "auto" a plain answer is one the model may give
        choice = d.get("tool_choice")
        return "tool_choice" if choice == "required" or isinstance(choice, dict) else None
    if _get_bool(d, "echo", False):
        return "echo"
    best_of = _get_int(d, "best_of", None)
    if best_of is not None and best_of != 1:
        return "best_of"
    suffix = d.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise _type_error("string_type", "suffix", suffix)
        return "suffix"
    return None


def _acceptance_override(d: dict[str, Any]) -> float | None:
    xargs = d.get("vllm_xargs")
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        raise _type_error("dict_type", "vllm_xargs", xargs)
    v = xargs.get("emulated_acceptance")
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise bad_request(
                "vllm_xargs.emulated_acceptance must be a number in [0, 1]", "vllm_xargs"
            ) from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
        raise bad_request("vllm_xargs.emulated_acceptance must be a number in [0, 1]", "vllm_xargs")
    return float(v)


def _token_ids(ids: list[int]) -> tuple[int, ...]:
    for t in ids:
        if not 0 <= t < VOCAB_SIZE:
            raise bad_request(f"Token id {t} is out of vocabulary", "prompt")
    return tuple(ids)


def _completion_prompts(d: dict[str, Any]) -> list[Prompt]:
    if "prompt" not in d:
        raise validation_error("missing", ["body", "prompt"], "Field required", d)
    p = d["prompt"]
    if isinstance(p, str):
        return [Prompt(p, encode_prompt(p))]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return [Prompt(x, encode_prompt(x)) for x in p]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [Prompt("", _token_ids(p))]
        if all(isinstance(x, list) and x and all(isinstance(t, int) for t in x) for x in p):
            return [Prompt("", _token_ids(x)) for x in p]
    if isinstance(p, list) and not p:
        raise bad_request("Prompt cannot be empty", "prompt")
    raise _type_error("string_type", "prompt", p)


def _message_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    raise validation_error(
        "string_type", ["body", "messages", i, "content"], _TYPE_MSGS["string_type"], content
    )


def _chat_prompt(d: dict[str, Any]) -> Prompt:
    if "messages" not in d:
        raise validation_error("missing", ["body", "messages"], "Field required", d)
    msgs = d["messages"]
    if not isinstance(msgs, list):
        raise _type_error("list_type", "messages", msgs)
    pairs: list[tuple[str, str]] = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise validation_error("dict_type", ["body", "messages", i], _TYPE_MSGS["dict_type"], msg)
        role = msg.get("role")
        if role is None:
            raise validation_error("missing", ["body", "messages", i, "role"], "Field required", msg)
        if not isinstance(role, str):
            raise validation_error(
                "string_type", ["body", "messages", i, "role"], _TYPE_MSGS["string_type"], role
            )
        pairs.append((role, _message_text(msg.get("content"), i)))
    continue_final = _get_bool(d, "continue_final_message", False)
    if continue_final and _get_bool(d, "add_generation_prompt", True):
        raise validation_error(
            "value_error",
            ["body"],
            "Value error, Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            d,
        )
    origin = None
    if continue_final and len(pairs) > 1 and pairs[-1][0] == "assistant":
        origin = Prompt(_chat_text(pairs[:-1]), encode_chat(pairs[:-1]))
    said = pairs[-1][1] if origin is not None else ""
    return Prompt(_chat_text(pairs), encode_chat(pairs, continue_final), origin, said)


def _chat_text(pairs: list[tuple[str, str]]) -> str:
    # alpha and the generated text follow what the user (and system) asked, not the template
    return "\n".join(c for r, c in pairs if r in ("user", "system", "developer")) or "\n".join(
        c for _, c in pairs
    )


def parse_request(chat: bool, d: dict[str, Any], cfg: EmulatorConfig) -> GenRequest:
    """Validate a completion / chat request like vLLM; raises :class:`ApiError`."""
    # -- schema (FastAPI/pydantic validation errors) --
    prompts = [_chat_prompt(d)] if chat else _completion_prompts(d)
    model = d.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("string_type", "model", model)
    stream = _get_bool(d, "stream", False)
    include_usage, continuous = _stream_options(d, stream)
    if chat:
        max_tokens = _get_int(d, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = _get_int(d, "max_tokens", None)
    else:
        max_tokens = _get_int(d, "max_tokens", 16)
    temperature = _get_float(d, "temperature", None)
    seed = _get_int(d, "seed", None)
    n = _get_int(d, "n", 1)
    min_p = _get_float(d, "min_p", None)
    logit_bias = d.get("logit_bias")
    unsupported = _unsupported(chat, d)
    return_token_ids = _get_bool(d, "return_token_ids", False)
    include_stop = _get_bool(d, "include_stop_str_in_output", False)
    stops = _stops(d)
    if chat:
        want_lp = _get_bool(d, "logprobs", False)
        top = _get_int(d, "top_logprobs", None)
        logprobs = (top or 0) if want_lp else None
    else:
        logprobs = _get_int(d, "logprobs", None)
    override = _acceptance_override(d)
    try:
        constraint = from_request(d)
        if constraint is not None:
            constraint.check()
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from None

    # -- model (404) --
    names = cfg.served_model_names
    if model is None or model == "":
        model = names[0]
    elif model not in names:
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
            "NotFoundError",
            "model",
        )

    # -- semantic checks (400 BadRequestError) --
    if n is not None and n != 1:
        raise bad_request(f"n={n} is not supported by this emulator; only n=1 is.", "n")
    if unsupported is not None:
        raise bad_request(f"{unsupported} is not supported by this emulator.", unsupported)
    greedy = temperature is not None and temperature < SAMPLING_EPS  # vLLM then sets min_p to 0
    if cfg.speculative and ((min_p is not None and min_p > SAMPLING_EPS and not greedy) or logit_bias):
        # vLLM refuses both on a server with speculative decoding (SamplingParams._validate_spec_decode)
        raise bad_request(
            "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding.",
            None,
        )
    if temperature is not None and temperature < 0:
        raise bad_request(f"temperature must be non-negative, got {temperature}.", "temperature")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        param = "top_logprobs" if chat else "logprobs"
        raise bad_request(
            f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
            param,
        )
    if max_tokens is not None:
        if max_tokens < 1:
            raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        if max_tokens > cfg.max_model_len:
            raise bad_request(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={cfg.max_model_len}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
    for p in prompts:
        n_in = len(p.ids)
        if n_in >= cfg.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, your request "
                f"has {n_in} input tokens. Please reduce the length of the input messages. "
                f"(parameter=input_tokens, value={n_in})",
                "input_tokens",
            )
        if max_tokens is not None and n_in + max_tokens > cfg.max_model_len:
            raise bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {cfg.max_model_len} tokens and your request has {n_in} input tokens "
                f"({max_tokens} > {cfg.max_model_len} - {n_in}). (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
    # vLLM's default temperature (no generation_config) is 1.0
    t = 1.0 if temperature is None else temperature
    return GenRequest(
        chat=chat,
        model=model,
        prompts=prompts,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        max_tokens=max_tokens,
        temperature=t,
        seed=seed,
        stops=stops,
        include_stop=include_stop,
        return_token_ids=return_token_ids,
        logprobs=logprobs,
        emulated_acceptance=override,
        constraint=constraint,
    )


# ---------------------------------------------------------------------------------------------
# responses


def _logprob_values(
    seq: Seq, start: int, end: int, top: int
) -> list[tuple[str, float, list[tuple[str, float]]]]:
    if seq.lp_rng is None:
        seq.lp_rng = random.Random(seq.rng.random())
    rng = seq.lp_rng
    scale = 0.3 if seq.alpha >= 0.5 else 2.0
    out = []
    for piece in seq.pieces[start:end]:
        lp = -abs(rng.gauss(0.0, scale)) - 0.001
        alts = [(piece, lp)]
        for j in range(max(0, top - 1)):
            alts.append((" " + WORDS[rng.randrange(len(WORDS))], lp - 1.0 - j - rng.random()))
        out.append((piece, lp, alts))
    return out


def completion_logprobs(seq: Seq, start: int, end: int, top: int) -> dict[str, Any]:
    vals = _logprob_values(seq, start, end, top)
    offsets = []
    off = seq.lp_offset
    for piece, _, _ in vals:
        offsets.append(off)
        off += len(piece)
    seq.lp_offset = off
    return {
        "text_offset": offsets,
        "token_logprobs": [v[1] for v in vals],
        "tokens": [v[0] for v in vals],
        "top_logprobs": [dict(v[2][: max(1, top)]) for v in vals],
    }


def chat_logprobs(seq: Seq, start: int, end: int, top: int) -> dict[str, Any]:
    vals = _logprob_values(seq, start, end, top)
    return {
        "content": [
            {
                "token": piece,
                "logprob": lp,
                "bytes": list(piece.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts[:top]
                ],
            }
            for piece, lp, alts in vals
        ]
    }


def usage_full(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def usage_short(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def spec_metrics(seqs: list[Seq], k: int) -> dict[str, Any]:
    steps = sum(s.spec_steps for s in seqs)
    acc = sum(s.accepted for s in seqs)
    drafted = steps * k
    return {
        "speculative_decoding": {
            "mean_acceptance_length": (1.0 + acc / steps) if steps else 1.0,
            "draft_acceptance_rate": (acc / drafted) if drafted else 0.0,
            "num_spec_steps": steps,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": acc,
        }
    }


class Responder:
    """Builds the JSON bodies and SSE chunks of one request."""

    __slots__ = ("created", "fingerprint", "k", "metrics_on", "model", "req", "rid")

    def __init__(
        self, req: GenRequest, rid: str, created: int, fingerprint: str, k: int, metrics_on: bool
    ) -> None:
        self.req = req
        self.rid = rid
        self.created = created
        self.fingerprint = fingerprint
        self.k = k
        self.metrics_on = metrics_on

    # -- non-streamed --------------------------------------------------------------------------
    def full(self, seqs: list[Seq]) -> bytes:
        req = self.req
        tids = req.return_token_ids
        prompt_total = sum(s.prompt_len for s in seqs)
        completion_total = sum(len(s.out_ids) for s in seqs)
        metrics = spec_metrics(seqs, self.k) if self.metrics_on else None
        if req.chat:
            s = seqs[0]
            lp = chat_logprobs(s, 0, len(s.out_ids), req.logprobs) if req.logprobs is not None else None
            body: dict[str, Any] = {
                "id": self.rid,
                "object": "chat.completion",
                "created": self.created,
                "model": req.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": s.full_text(),
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "reasoning": None,
                        },
                        "logprobs": lp,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": s.out_ids if tids else None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": usage_full(prompt_total, completion_total),
                "prompt_logprobs": None,
                "prompt_token_ids": list(s.prompt_ids) if tids else None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": metrics,
            }
        else:
            choices = []
            for s in seqs:
                lp = (
                    completion_logprobs(s, 0, len(s.out_ids), req.logprobs)
                    if req.logprobs is not None
                    else None
                )
                choices.append(
                    {
                        "index": s.index,
                        "text": s.full_text(),
                        "logprobs": lp,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": s.out_ids if tids else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": list(s.prompt_ids) if tids else None,
                        "routed_experts": None,
                    }
                )
            body = {
                "id": self.rid,
                "object": "text_completion",
                "created": self.created,
                "model": req.model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": usage_full(prompt_total, completion_total),
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": metrics,
            }
        return orjson.dumps(body)

    # -- streamed ------------------------------------------------------------------------------
    def chunk(self, seq: Seq, start: int, end: int, delta: str, finished: bool, last: bool) -> bytes:
        """The SSE event(s) for one engine output of ``seq``; ``last``: it finishes its choice and no usage
        chunk follows, so it carries the fingerprint (vLLM stamps every choice's finishing chunk)."""
        req = self.req
        tids = req.return_token_ids
        out = b""
        if req.chat:
            if start == 0:
                first: dict[str, Any] = {
                    "id": self.rid,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": req.model,
                    "choices": [
                        {
                            "index": seq.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                if req.continuous_usage:
                    first["usage"] = {**usage_short(seq.prompt_len, 0), "completion_tokens_details": None}
                first["prompt_token_ids"] = list(seq.prompt_ids) if tids else None
                first["prompt_text"] = None
                out = b"data: " + orjson.dumps(first) + b"\n\n"
            lp = chat_logprobs(seq, start, end, req.logprobs) if req.logprobs is not None else None
            choice: dict[str, Any] = {"index": seq.index, "delta": {"content": delta}, "logprobs": lp}
            if finished:
                choice["finish_reason"] = seq.finish_reason
                choice["stop_reason"] = seq.stop_reason
            else:
                choice["finish_reason"] = None
            choice["token_ids"] = seq.out_ids[start:end] if tids else None
            body: dict[str, Any] = {
                "id": self.rid,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": req.model,
                "choices": [choice],
            }
            if req.continuous_usage:
                body["usage"] = {**usage_short(seq.prompt_len, end), "completion_tokens_details": None}
        else:
            lp = completion_logprobs(seq, start, end, req.logprobs) if req.logprobs is not None else None
            body = {
                "id": self.rid,
                "object": "text_completion",
                "created": self.created,
                "model": req.model,
                "choices": [
                    {
                        "index": seq.index,
                        "text": delta,
                        "logprobs": lp,
                        "finish_reason": seq.finish_reason if finished else None,
                        "stop_reason": seq.stop_reason if finished else None,
                        "prompt_token_ids": list(seq.prompt_ids) if tids and start == 0 else None,
                        "token_ids": seq.out_ids[start:end] if tids else None,
                    }
                ],
            }
            if req.continuous_usage:
                body["usage"] = usage_short(seq.prompt_len, end)
        if last:
            body["system_fingerprint"] = self.fingerprint
        return out + b"data: " + orjson.dumps(body) + b"\n\n"

    def tail(self, seqs: list[Seq]) -> bytes:
        """The final usage chunk (when asked for) and the ``[DONE]`` terminator."""
        req = self.req
        if not req.include_usage:
            return b"data: [DONE]\n\n"
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": self.created,
            "model": req.model,
            "choices": [],
            "usage": usage_short(sum(s.prompt_len for s in seqs), sum(len(s.out_ids) for s in seqs)),
            "system_fingerprint": self.fingerprint,
        }
        if self.metrics_on:
            body["metrics"] = spec_metrics(seqs, self.k)
        return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


def models_body(cfg: EmulatorConfig, created: int, perm_id: str) -> bytes:
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": cfg.root,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [
                {
                    "id": perm_id,
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for name in cfg.served_model_names
    ]
    return orjson.dumps({"object": "list", "data": data})
