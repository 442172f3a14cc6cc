"""The emulator's ``/v1/embeddings``, ``/tokenize`` and ``/detokenize``, in vLLM's shapes."""

from __future__ import annotations

import base64
import math
from array import array

import httpx
import pytest

from gateway.emulator import tokenizer

MODEL = "demo-model"


async def test_embeddings_are_deterministic_unit_vectors(inproc: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": ["the same text", "another text"]}
    a = (await inproc.post("/v1/embeddings", json=body)).json()
    b = (await inproc.post("/v1/embeddings", json=body)).json()
    assert a["object"] == "list" and a["usage"]["prompt_tokens"] > 0 and a["usage"]["completion_tokens"] == 0
    va, vb = a["data"][0]["embedding"], a["data"][1]["embedding"]
    assert va == b["data"][0]["embedding"] and va != vb
    assert len(va) == 32 and math.isclose(sum(x * x for x in va), 1.0, rel_tol=1e-9)
    b64 = (await inproc.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
    decoded = array("f", base64.b64decode(b64["data"][0]["embedding"])).tolist()
    assert decoded == pytest.approx(va, abs=1e-6)
    short = (await inproc.post("/v1/embeddings", json={**body, "dimensions": 8})).json()
    assert len(short["data"][0]["embedding"]) == 8
    too_wide = await inproc.post("/v1/embeddings", json={**body, "dimensions": 33})
    assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "dimensions"


@pytest.fixture
def fresh_vocabulary() -> None:
    """The emulator's tokenizer as a new process has it: ids are hashes, and an id two pieces share
    decodes to the first piece seen, so random text tokenised earlier in this test process (the fuzzers')
    could take an id of this test's text and make its round trip fail by chance."""
    tokenizer._TEXT.clear()
    tokenizer.piece_id.cache_clear()
    tokenizer.encode.cache_clear()


@pytest.mark.usefixtures("fresh_vocabulary")
async def test_tokenize_detokenize_round_trip(inproc: httpx.AsyncClient) -> None:
    text = "Tokenisers split text, numbers like 12345 and symbols like {}!"
    tok = (await inproc.post("/tokenize", json={"model": MODEL, "prompt": text})).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 1024 and tok["token_strs"] is None
    plain = (
        await inproc.post("/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False})
    ).json()
    assert plain["count"] == tok["count"] - 1  # without BOS
    back = (await inproc.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]})).json()
    assert back == {"prompt": text}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    chat_ids = (await inproc.post("/tokenize", json=chat)).json()
    assert chat_ids["count"] > plain["count"]  # the template's markers
    bad = await inproc.post("/detokenize", json={"model": MODEL, "tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
