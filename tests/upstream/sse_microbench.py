"""CPU per stream chunk of the stream meter (SSE framing, JSON, usage bookkeeping), in µs.

    python -m tests.upstream.sse_microbench [chunks [line end ...]]    e.g. 100000 '\\n' '\\r\\n'

Feeds a vLLM-shaped chat stream with continuous usage through :class:`StreamMeter` the way the relay
does, one upstream read at a time, and prints the CPU time (``process_time``) per chunk for the
pass-through path (the client asked for continuous usage: bytes relayed unchanged) and the rewriting
path (usage cut out), with one or four events per read, and with ``\\n``, ``\\r\\n`` and ``\\r`` line
ends (all three by default).
Not a test: its numbers depend on the machine; compare runs on the same one.
"""

from __future__ import annotations

import sys
import time

import orjson

from gateway.upstream.stream import StreamMeter


def chunk(i: int, newline: bytes) -> bytes:
    body = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "Qwen/Qwen3-32B",
        "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None, "finish_reason": None}],
        "usage": {"prompt_tokens": 50, "total_tokens": 50 + i, "completion_tokens": i},
    }
    return b"data: " + orjson.dumps(body) + newline * 2


def per_chunk_us(n: int, per_read: int, keep: bool, newline: bytes) -> tuple[float, bool]:
    """CPU µs per chunk, and whether the meter read every chunk's token count."""
    chunks = [chunk(i + 1, newline) for i in range(n)]
    reads = [b"".join(chunks[i : i + per_read]) for i in range(0, n, per_read)]
    meter = StreamMeter(0.0, keep_usage_chunk=keep, keep_continuous=keep)
    t0 = time.process_time()
    for raw in reads:
        meter.feed(raw)
    spent = time.process_time() - t0
    return spent / n * 1e6, meter.completion_tokens == n


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 100_000
    endings = [e.encode().decode("unicode_escape").encode() for e in argv[1:]] or [b"\n", b"\r\n", b"\r"]
    for newline in endings:
        for keep in (True, False):
            for per_read in (1, 4):
                runs = [per_chunk_us(n, per_read, keep, newline) for _ in range(3)]
                best = min(us for us, _ in runs)
                read = "" if all(ok for _, ok in runs) else "  (token counts NOT read)"
                path = "pass-through" if keep else "rewrite     "
                print(
                    f"{path} line end {newline!r:7} {per_read} event(s)/read: {best:6.2f} µs/chunk{read}",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
