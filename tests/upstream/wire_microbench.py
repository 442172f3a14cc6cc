"""CPU per forwarded request of the two upstream clients, aiohttp's and the lean one, in µs.

    python -m tests.upstream.wire_microbench [requests]        (default 20000)

Starts a loopback upstream in a child process (a raw asyncio server on uvloop that answers every POST
with a fixed vLLM-shaped completion, keep-alive), then, in this process on uvloop, sends the same
non-streamed completion through each client the way forwarding does (8 concurrent callers, the body
read to its end, the connection released) and prints this process's CPU time (``process_time``: user
and system) per request and the rate. The upstream's CPU is not counted.
Not a test: its numbers depend on the machine; compare runs on the same one.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop

from gateway.upstream.wire import WirePool
from tests.upstream.scripted import read_request

BODY = b'{"model":"m","prompt":"Write a haiku about the sea.","max_tokens":16}'
HEADERS = {
    "content-type": "application/json",
    "accept-encoding": "identity",
    "x-request-id": "0123456789abcdef",
}
ANSWER = (
    b'{"id":"cmpl-0","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,'
    b'"text":" The quick brown fox jumps over the lazy dog","logprobs":null,"finish_reason":"length",'
    b'"stop_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":25,"completion_tokens":16}}'
)
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(ANSWER),
    ANSWER,
)
CALLERS = 8


def _serve(port: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                writer.write(RESPONSE)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    uvloop.run(main())


async def _measure(name: str, one: Callable[[], Awaitable[None]], n: int) -> None:
    for _ in range(500):  # connections made, code warm
        await one()

    async def caller(k: int) -> None:
        for _ in range(k):
            await one()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(n // CALLERS) for _ in range(CALLERS)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = n // CALLERS * CALLERS
    print(f"{name:8} {cpu / done * 1e6:6.1f} µs CPU per request   {done / wall:8.0f} req/s")


async def _run(port: int, n: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/completions"
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )

    async def via_aiohttp() -> None:
        r = await session.request("POST", url, data=BODY, headers=HEADERS, allow_redirects=False)
        async for _ in r.content.iter_any():
            pass
        r.release()

    wire = WirePool(connect_s=5.0)

    async def via_wire() -> None:
        r = await wire.request("POST", "127.0.0.1", port, "/v1/completions", HEADERS, BODY)
        async for _ in r.chunks():
            pass
        r.release()

    for _ in range(2):
        await _measure("aiohttp", via_aiohttp, n)
        await _measure("wire", via_wire, n)
    await session.close()
    wire.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    ports: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    upstream = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    upstream.start()
    try:
        uvloop.run(_run(ports.get(timeout=10), n))
    finally:
        upstream.terminate()
        upstream.join(5)


if __name__ == "__main__":
    main()
