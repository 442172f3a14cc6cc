"""vLLM's non-generating routes: ``/v1/embeddings``, ``/tokenize`` and ``/detokenize``.

Embeddings are deterministic: each input's vector comes from a hash of its token ids, unit length,
``embedding_dim`` wide (or ``dimensions`` when asked), as floats or, with ``encoding_format:
"base64"`` (what the ``openai`` SDK asks for by default), little-endian float32 bytes in base64.
Tokenising uses the emulator's own tokenizer (:mod:`gateway.emulator.tokenizer`); ids it hands out
detokenise back to the same text.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
from array import array
from typing import Any

import orjson

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.protocol import ApiError, bad_request, validation_error
from gateway.emulator.tokenizer import VOCAB_SIZE, decode, encode, encode_chat, encode_prompt, known, pieces


def _model(d: dict[str, Any], cfg: EmulatorConfig) -> str:
    model = d.get("model")
    names = cfg.served_model_names
    if model is None or model == "":
        return names[0]
    if not isinstance(model, str) or model not in names:
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
            "NotFoundError",
            "model",
        )
    return model


def _ids_list(value: Any, param: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise validation_error(
            "list_type", ["body", param], "Input should be a valid list of integers", value
        )
    for t in value:
        if not 0 <= t < VOCAB_SIZE:
            raise bad_request(f"Token id {t} is out of vocabulary", param)
    return list(value)


def _inputs(value: Any) -> list[tuple[int, ...]]:
    """The token ids of each input: a string, strings, ids, or lists of ids."""
    if isinstance(value, str):
        return [encode_prompt(value)]
    if isinstance(value, list) and value:
        if all(isinstance(x, str) for x in value):
            return [encode_prompt(x) for x in value]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [tuple(_ids_list(value, "input"))]
        if all(isinstance(x, list) for x in value):
            return [tuple(_ids_list(x, "input")) for x in value]
    if isinstance(value, list):
        raise bad_request("Input cannot be empty", "input")
    raise validation_error("string_type", ["body", "input"], "Input should be a valid string", value)


def vector(ids: tuple[int, ...], dim: int) -> list[float]:
    """A unit vector that depends only on ``ids`` (and ``dim``)."""
    seed = hashlib.blake2b(array("i", ids).tobytes(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(seed, "little"))
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def embeddings_body(d: dict[str, Any], cfg: EmulatorConfig, rid: str, created: int) -> tuple[bytes, int]:
    """The response body and the number of prompt tokens (the emulated prefill's size)."""
    model = _model(d, cfg)
    if "input" not in d:
        raise validation_error("missing", ["body", "input"], "Field required", d)
    inputs = _inputs(d["input"])
    dim = d.get("dimensions")
    if dim is None:
        dim = cfg.embedding_dim
    elif isinstance(dim, bool) or not isinstance(dim, int):
        raise validation_error("int_type", ["body", "dimensions"], "Input should be a valid integer", dim)
    elif not 1 <= dim <= cfg.embedding_dim:
        raise bad_request(f"dimensions must be between 1 and {cfg.embedding_dim}, got {dim}", "dimensions")
    fmt = d.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request(f"encoding_format must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    n_tokens = 0
    data = []
    for i, ids in enumerate(inputs):
        if len(ids) > cfg.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                f"requested {len(ids)} tokens in the input for embedding generation. Please reduce the "
                "length of the input.",
                "input",
            )
        n_tokens += len(ids)
        v = vector(ids, dim)
        emb: list[float] | str = v if fmt == "float" else base64.b64encode(array("f", v).tobytes()).decode()
        data.append({"index": i, "object": "embedding", "embedding": emb})
    usage = {
        "prompt_tokens": n_tokens,
        "total_tokens": n_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    body = {"id": rid, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
    return orjson.dumps(body), n_tokens


def tokenize_body(d: dict[str, Any], cfg: EmulatorConfig) -> bytes:
    """``/tokenize``: a completion prompt (``prompt``) or a chat (``messages``), like vLLM."""
    _model(d, cfg)
    want_strs = d.get("return_token_strs") is True
    if "messages" in d:
        msgs = d["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise validation_error("list_type", ["body", "messages"], "Input should be a valid list", msgs)
        pairs = [
            (str(m.get("role", "user")), m.get("content") if isinstance(m.get("content"), str) else "")
            for m in msgs
        ]
        ids = list(encode_chat(pairs, d.get("continue_final_message") is True))
        strs = None
    elif "prompt" in d:
        prompt = d["prompt"]
        if not isinstance(prompt, str):
            raise validation_error(
                "string_type", ["body", "prompt"], "Input should be a valid string", prompt
            )
        special = d.get("add_special_tokens", True) is not False
        ids = list(encode_prompt(prompt) if special else encode(prompt))
        strs = ([""] if special else []) + pieces(prompt)
    else:
        raise validation_error("missing", ["body", "prompt"], "Field required", d)
    return orjson.dumps(
        {
            "count": len(ids),
            "max_model_len": cfg.max_model_len,
            "tokens": ids,
            "token_strs": (strs if strs is not None else [decode([t]) for t in ids]) if want_strs else None,
        }
    )


def detokenize_body(d: dict[str, Any], cfg: EmulatorConfig) -> bytes:
    """``/detokenize``: the text of ``tokens``; an id this emulator never handed out is a 400."""
    _model(d, cfg)
    if "tokens" not in d:
        raise validation_error("missing", ["body", "tokens"], "Field required", d)
    ids = _ids_list(d["tokens"], "tokens")
    unknown = [t for t in ids if not known(t)]
    if unknown:
        raise bad_request(f"Token id {unknown[0]} is not in this emulator's vocabulary", "tokens")
    return orjson.dumps({"prompt": decode(ids)})
