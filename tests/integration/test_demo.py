"""`specroute demo` serves curl and the OpenAI SDK (sync, async, streaming; completions and chat)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway import stack

MODEL = "demo-model"
STRUCTURED = "Repeat the following line exactly 20 times: hello world"
OPEN_ENDED = "Write a poem about the sea at night."


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    port = stack.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(port), "--time-scale", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SPECROUTE_PARENT_PID": str(os.getpid())},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        stack.wait_healthy(url + "/ready", proc, timeout=60)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
        banner = out.decode()
        assert url in banner and "curl" in banner and "OpenAI(" in banner
        assert "Capacity before requests queue" in banner and "requests/s" in banner
        assert "guidellm run" in banner and "--tokenizer kind=hf_auto,model=" in banner


def test_sync_sdk_completions_and_chat(demo):
    client = openai.OpenAI(base_url=demo + "/v1", api_key="unused")
    comp = client.completions.with_raw_response.create(
        model=MODEL, prompt=STRUCTURED, max_tokens=32, temperature=0
    )
    assert comp.headers["x-specroute-pool"] == "speculative"
    assert comp.headers["x-specroute-class"] == "structured"
    assert comp.headers["x-specroute-reason"]
    parsed = comp.parse()
    assert parsed.choices[0].text and parsed.usage.completion_tokens == 32
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": OPEN_ENDED}], max_tokens=16
    )
    assert chat.choices[0].message.content
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_streaming_sdk(demo):
    client = openai.OpenAI(base_url=demo + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": STRUCTURED}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text and usage is not None and usage.completion_tokens == 40
    pieces = list(client.completions.create(model=MODEL, prompt=OPEN_ENDED, max_tokens=12, stream=True))
    assert pieces and all(p.choices for p in pieces)


def test_async_sdk(demo):
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=demo + "/v1", api_key="unused")
        async with client:
            comps = await asyncio.gather(
                *(
                    client.completions.create(model=MODEL, prompt=f"{STRUCTURED} {i}", max_tokens=8)
                    for i in range(4)
                )
            )
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": OPEN_ENDED}], max_tokens=8, stream=True
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        return [c.choices[0].text for c in comps] + [streamed]

    texts = asyncio.run(run())
    assert len(texts) == 5 and all(texts)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(demo):
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-D",
            "-",
            demo + "/v1/completions",
            "-H",
            "content-type: application/json",
            "-d",
            '{"model": "demo-model", "prompt": "' + OPEN_ENDED + '", "max_tokens": 8}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.lower()
    assert "http/1.1 200" in out
    assert "x-specroute-class: open-ended" in out
    # open-ended goes to baseline, except the small share the adaptive strategy explores with
    assert "x-specroute-pool: baseline" in out or "x-specroute-reason: explore" in out
    assert '"text_completion"' in out
    assert httpx.get(demo + "/v1/models").json()["data"][0]["id"] == MODEL


def test_responses_and_embeddings_through_the_sdk(demo):
    client = openai.OpenAI(base_url=demo + "/v1", api_key="unused")
    response = client.responses.with_raw_response.create(
        model=MODEL, input=STRUCTURED, instructions="Answer exactly.", max_output_tokens=16
    )
    assert response.headers["x-specroute-class"] and response.headers["x-specroute-pool"]
    parsed = response.parse()
    assert parsed.output_text and parsed.usage is not None and parsed.usage.output_tokens == 16
    stream = client.responses.create(model=MODEL, input=OPEN_ENDED, max_output_tokens=8, stream=True)
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    embedded = client.embeddings.create(model=MODEL, input=["one", "two"])
    assert len(embedded.data) == 2 and embedded.data[0].embedding != embedded.data[1].embedding


def test_the_demo_refuses_a_port_another_server_holds():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "gateway", "demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SPECROUTE_PARENT_PID": str(os.getpid())},
        )
    assert out.returncode != 0
    assert out.stderr.strip() == f"port {port} is in use; pass --port"


def test_readiness_refuses_a_foreign_server_that_answers_health():
    """A server already answering /health 200 on the port is not taken for the process just started."""
    port = stack.free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stack.wait_healthy(f"http://127.0.0.1:{port}/health", other, timeout=30)  # up; no token asked
        with pytest.raises(stack.PortInUse, match=f"port {port} is in use; pass --port"):
            stack.start_emulator("baseline", port=port)
    finally:
        other.terminate()
        other.wait(10)
