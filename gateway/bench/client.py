"""A lean HTTP/1.1 client over keep-alive connections, for the load generator.

The benchmark shares two cores with the gateway and the upstream it measures, so the client must cost
far less per request than what it measures: a general client (httpx) spends several hundred
microseconds of CPU per request, which at 1,500 req/s would make the load generator the bottleneck.
This one writes one pre-built request and parses only what it needs: the status line, the headers,
``Content-Length`` or chunked bodies.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The connection failed or the reply was not valid HTTP/1.1."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        self.writer.close()


@dataclass
class Reply:
    """The status and headers of a response; the body is read with :meth:`chunks` or :meth:`read`."""

    status: int
    headers: dict[str, str]
    _client: Client
    _conn: _Conn | None
    _length: int | None
    _chunked: bool
    _keep: bool
    _done: bool = field(default=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as the server sends it; the connection goes back to the pool once it is all read."""
        assert self._conn is not None, "body already read"
        reader = self._conn.reader
        try:
            if self._chunked:
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._length is not None:
                left = self._length
                while left > 0:
                    data = await reader.read(min(left, 65536))
                    if not data:
                        raise HTTPError("connection closed mid-body")
                    left -= len(data)
                    yield data
            else:
                self._keep = False
                while data := await reader.read(65536):
                    yield data
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self._keep = False
            raise HTTPError(f"reading body: {e!r}") from None
        finally:
            self.release()
        self._done = True

    async def read(self) -> bytes:
        if self._length is not None and not self._chunked:
            assert self._conn is not None, "body already read"
            try:
                data = await self._conn.reader.readexactly(self._length) if self._length else b""
            except (OSError, asyncio.IncompleteReadError) as e:
                self._keep = False
                self.release()
                raise HTTPError(f"reading body: {e!r}") from None
            self._done = True
            self.release()
            return data
        return b"".join([c async for c in self.chunks()])

    def release(self) -> None:
        """Return the connection for reuse if the body was read whole, else close it."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._keep and (self._done or self._length == 0):
            self._client._idle.append(conn)
        else:
            conn.close()


class Client:
    """Requests to one ``base_url`` over kept-alive connections (one per request in flight)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s) URL, got {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        if self.prefix.endswith("/v1"):  # accept both http://h:p and http://h:p/v1 (the OpenAI SDK style)
            self.prefix = self.prefix[:-3]
        host = self.host if parts.port is None else f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {host}\r\nContent-Type: application/json\r\nAccept: */*\r\n{extra}".encode()
        self._idle: list[_Conn] = []
        self._ssl = ssl.create_default_context() if self.tls else None

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=1 << 20)
        except OSError as e:
            raise HTTPError(f"connect {self.host}:{self.port}: {e}") from None
        return _Conn(reader, writer)

    async def request(self, path: str, body: bytes = b"", method: str = "POST") -> Reply:
        """Send one request and return once the headers have arrived.

        A kept-alive connection the server has since closed is retried once on a fresh one: the
        request never reached the server, so sending it again is safe.
        """
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode()
            + self._head
            + b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for attempt in range(2):
            # the retry takes a fresh connection: the other idle ones may be just as stale
            conn = self._idle.pop() if self._idle and attempt == 0 else await self._connect()
            reused = conn.reused
            conn.reused = True
            try:
                conn.writer.write(head + body)
                return await self._read_head(conn)
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                HTTPError,
                ValueError,
            ) as e:
                conn.close()
                if reused and attempt == 0 and not isinstance(e, HTTPError):
                    continue
                raise HTTPError(f"{method} {path}: {e!r}") from None
        raise AssertionError("unreachable")

    async def _read_head(self, conn: _Conn) -> Reply:
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        lines = raw[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise HTTPError(f"not HTTP/1.x: {lines[0]!r}")
        status = int(rest[:3])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = None if chunked or "content-length" not in headers else int(headers["content-length"])
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        return Reply(status, headers, self, conn, length, chunked, keep)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
