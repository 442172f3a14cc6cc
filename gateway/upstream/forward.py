"""Forwarding one request: pick an endpoint, send, retry or fail over, stream back.

Retries happen only before the first byte has gone to the client: on a connect error, a 5xx, or
no first byte within ``timeouts.first_byte_s`` (and once at once, on the same endpoint, when a
connection drops before any of the response arrives). A streamed response is held back until its first
upstream chunk has arrived, so a stream that dies before producing anything is retried too. Both
pools serve the same model, so moving a request to the other pool changes its speed, not its answer.

Forwarding speaks to aiohttp's connection pool directly. The gateway's own calls (health checks,
scrapes, discovery) use httpx's API over the same pool; on this path the httpx layer (building and
parsing a URL, copying headers both ways, wrapping the response) cost ~70 µs of CPU per request, a
tenth of the gateway's whole budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
import httpx
import orjson
from prometheus_client import Gauge

from gateway.api.errors import APIError, sse_error_event
from gateway.config import PoolName, Settings
from gateway.observability import Metrics
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.resume import Resumption, Splice
from gateway.upstream.stream import StreamMeter

log = logging.getLogger("specroute.upstream")

OTHER: dict[PoolName, PoolName] = {"speculative": "baseline", "baseline": "speculative"}


@dataclass(slots=True)
class Sent:
    """A response whose first bytes have arrived; the rest is still upstream."""

    endpoint: Endpoint
    response: aiohttp.ClientResponse
    first: bytes
    chunks: AsyncIterator[bytes]
    retries: int

    @property
    def pool(self) -> PoolName:
        return self.endpoint.pool


class Upstreams:
    """The pools, the shared HTTP client and the retry policy."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient,
        session: aiohttp.ClientSession,
        pools: dict[PoolName, Pool],
        metrics: Metrics,
    ):
        self.settings = settings
        self.client = client
        self.session = session
        self.pools = pools
        self.metrics = metrics
        t = settings.timeouts
        # connect only: how long a response may take is the first-byte / gap / total budget's business
        self._timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_s, sock_connect=t.connect_s)
        self._inflight: dict[Endpoint, Gauge] = {}

    def _busy(self, endpoint: Endpoint, delta: int) -> None:
        """Count a request in or out of an endpoint, in the balancer and in the shared gauge.

        The gauge moves with every request (not set at scrape time) so that with several workers
        the summed value is exact.
        """
        endpoint.outstanding += delta
        gauge = self._inflight.get(endpoint)
        if gauge is None:
            gauge = self._inflight[endpoint] = self.metrics.inflight.labels(endpoint.pool, endpoint.name)
        gauge.inc(delta)

    def any_available(self) -> bool:
        return any(p.has_available() for p in self.pools.values())

    def _candidates(self, pool: PoolName, allow_failover: bool) -> list[PoolName]:
        if allow_failover and self.settings.retries.failover_to_other_pool:
            return [pool, OTHER[pool]]
        return [pool]

    async def send(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        pool: PoolName,
        allow_failover: bool = True,
        first_byte_s: float | None = None,
        exclude: Sequence[Endpoint] = (),
        attempts: int | None = None,
    ) -> Sent:
        """Send until one endpoint gives a first byte (or a 4xx); raise :class:`APIError` if none does.

        A non-streamed upstream response sends its first byte only when it is complete, so callers
        pass a longer ``first_byte_s`` for those. A resumed stream passes the endpoints that broke
        it (``exclude``) and what is left of the request's ``attempts``.
        """
        first_byte_s = first_byte_s or self.settings.timeouts.first_byte_s
        tried: list[Endpoint] = list(exclude)
        last_error: APIError | None = None
        for attempt in range(self.settings.retries.attempts if attempts is None else attempts):
            endpoint = None
            for name in self._candidates(pool, allow_failover):
                endpoint = self.pools[name].pick(exclude=tried)
                if endpoint is not None:
                    break
            if endpoint is None:
                break
            if attempt:
                self.metrics.retries.labels(endpoint.pool).inc()
                if self.settings.retries.backoff_s:
                    await asyncio.sleep(self.settings.retries.backoff_s)
            tried.append(endpoint)
            self._busy(endpoint, 1)
            response: aiohttp.ClientResponse | None = None
            try:
                async with asyncio.timeout(first_byte_s):
                    response = await self._post(endpoint, path, body, headers)
                    chunks = response.content.iter_any()
                    if response.status >= 500:
                        raise _UpstreamStatus(response.status, await response.read())
                    first = b""
                    async for piece in chunks:
                        if piece:
                            first = piece
                            break
                    if not first and response.status < 300:
                        raise _ClosedEarly
                return Sent(endpoint, response, first, chunks, retries=attempt)
            except _UpstreamStatus as e:
                kind, last_error = "status_5xx", _reported_status(e.status, e.body)
            except _UNREACHABLE:  # before TimeoutError: aiohttp's connect time-out is one too
                kind = "connect"
                last_error = APIError(
                    503, f"no upstream endpoint could be reached (last tried: {endpoint.name})"
                )
            except TimeoutError:
                kind = "timeout"
                last_error = APIError(504, f"upstream endpoint {endpoint.name} sent nothing in time")
            except aiohttp.ClientError as e:
                kind = "protocol"
                last_error = APIError(502, f"upstream endpoint {endpoint.name} failed: {type(e).__name__}")
            except BaseException:  # cancelled: the client went away; closing aborts the upstream request
                self._busy(endpoint, -1)
                if response is not None:
                    response.close()
                raise
            self._busy(endpoint, -1)
            if response is not None:
                response.close()
            self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, kind).inc()
            if endpoint.record_failure(self.settings.health):
                log.warning("ejected %s/%s after repeated failures", endpoint.pool, endpoint.name)
        if last_error is None:
            raise APIError(503, "no healthy upstream endpoint is available; try again shortly")
        raise last_error

    async def _post(
        self, endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """POST, and once more if the connection dropped before any of the response arrived.

        A pooled keep-alive connection that the server closes just as a request goes out on it (vLLM
        and uvicorn drop idle ones after 5 s) fails this way through no fault of the endpoint, so the
        second try, on another connection, does not count against it. aiohttp retries such failures
        itself only for idempotent methods; a completion is as safe to resend, and a second failure
        is handled as usual. A refused connection is not retried here: the endpoint is not there.
        """

        def post() -> Awaitable[aiohttp.ClientResponse]:
            url = endpoint.base_url + path
            return self.session.request(
                "POST", url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False
            )

        try:
            return await post()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if isinstance(e, aiohttp.ClientConnectorError):
                raise
            self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, "dropped_connection").inc()
            return await post()

    async def relay(
        self,
        sent: Sent,
        meter: StreamMeter | None,
        on_done: Callable[[Sent, int | None], None],
        resume: Resumption | None = None,
    ) -> AsyncIterator[bytes]:
        """Yield the response to the client chunk by chunk, enforcing gap and total timeouts.

        A stream that breaks (reset, gap timeout) goes on on another endpoint when ``resume`` says
        how (:mod:`gateway.upstream.resume`); otherwise it ends with an error event. ``on_done``
        runs exactly once, with the endpoint that served the end of the stream and the error
        status when the stream broke.
        """
        timeouts = self.settings.timeouts
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s
        failed: int | None = None
        splice: Splice | None = None
        piece = sent.first
        try:
            while True:
                if splice is not None:
                    piece = splice.feed(piece)
                out = meter.feed(piece) if meter else piece
                if out:
                    yield out
                budget = min(timeouts.chunk_gap_s, deadline - loop.time())
                try:
                    async with asyncio.timeout(max(budget, 0.0)):
                        piece = await anext(sent.chunks)
                    continue
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    failed, kind = 504, "timeout"
                    message = "upstream stopped sending; the response is incomplete"
                except aiohttp.ClientError:
                    failed, kind = 502, "stream"
                    message = "upstream connection broke; the response is incomplete"
                    sent.endpoint.record_failure(self.settings.health)
                self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, kind).inc()
                if meter is None:
                    break
                meter.discard_partial()
                resumed = None
                if resume is not None and deadline > loop.time():
                    resumed = await self._resume(sent, resume, deadline - loop.time())
                if resumed is None:
                    yield sse_error_event(failed, message)
                    break
                assert resume is not None
                self._busy(sent.endpoint, -1)
                _close(sent.response, complete=False)
                sent, failed, piece = resumed, None, resumed.first
                splice = resume.splice()
            if failed is None and meter:
                rest = meter.flush()
                if rest:
                    yield rest
        except (asyncio.CancelledError, GeneratorExit):
            failed = 499  # the client went away; closing the upstream response aborts its request
            raise
        finally:
            self._busy(sent.endpoint, -1)
            _close(sent.response, complete=failed is None)
            if failed is None:
                sent.endpoint.record_success()
            on_done(sent, failed)

    async def _resume(self, sent: Sent, resume: Resumption, time_left: float) -> Sent | None:
        """Continue a broken stream on another endpoint, within the request's attempts and time."""
        pool = sent.pool
        if not resume.attempts_used:
            resume.attempts_used = sent.retries + 1
        resume.broken.append(sent.endpoint)
        left = self.settings.retries.attempts - resume.attempts_used
        body = resume.body()
        if body is None or left < 1:
            why = resume.transcript.blocked or ("no attempts left" if left < 1 else "not continuable")
            log.info("stream from %s/%s not resumed: %s", pool, sent.endpoint.name, why)
            self.metrics.stream_resumptions.labels(pool, "refused").inc()
            return None
        new: Sent | None = None
        try:
            async with asyncio.timeout(time_left):
                new = await self.send(
                    resume.path, body, resume.headers, pool, exclude=resume.broken, attempts=left
                )
        except (APIError, TimeoutError) as e:
            log.warning("stream from %s/%s could not be resumed: %s", pool, sent.endpoint.name, e)
        if new is not None:
            resume.attempts_used += new.retries + 1
            if new.response.status < 300:
                resume.endpoints.append(new.endpoint.name)
                self.metrics.stream_resumptions.labels(pool, "resumed").inc()
                return new
            log.warning(
                "stream from %s/%s could not be resumed: %s answered HTTP %d",
                pool,
                sent.endpoint.name,
                new.endpoint.name,
                new.response.status,
            )
            self._busy(new.endpoint, -1)
            _close(new.response, complete=False)
        self.metrics.stream_resumptions.labels(pool, "failed").inc()
        return None

    async def read_all(self, sent: Sent) -> bytes:
        """The rest of a non-streamed body, within the gap timeout between reads."""
        parts = [sent.first]
        complete = False
        try:
            while True:
                try:
                    async with asyncio.timeout(self.settings.timeouts.chunk_gap_s):
                        parts.append(await anext(sent.chunks))
                except StopAsyncIteration:
                    break
            complete = True
        except TimeoutError:
            self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "timeout").inc()
            raise APIError(504, f"upstream endpoint {sent.endpoint.name} stopped sending") from None
        except aiohttp.ClientError:
            self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "stream").inc()
            sent.endpoint.record_failure(self.settings.health)
            raise APIError(502, f"upstream endpoint {sent.endpoint.name} broke the connection") from None
        finally:
            self._busy(sent.endpoint, -1)
            _close(sent.response, complete)
        sent.endpoint.record_success()
        return b"".join(parts)


def _close(response: aiohttp.ClientResponse, complete: bool) -> None:
    """A complete response's connection goes back to the pool; an unfinished one is closed, which
    aborts the upstream request (vLLM stops generating for a client that went away)."""
    if complete:
        response.release()
    else:
        response.close()


class _ClosedEarly(aiohttp.ClientConnectionError):
    """The upstream ended a response without sending a byte of it."""


# Failures before any response byte that mean "nobody answered": refused, reset, a pooled keep-alive
# connection found dead, or closed mid-headers. Safe to retry; when every attempt ends so, the gateway
# says 503.
_UNREACHABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class _UpstreamStatus(Exception):
    def __init__(self, status: int, body: bytes):
        self.status = status
        self.body = body


def _reported_status(status: int, body: bytes) -> APIError:
    """A 5xx that will not be retried again: say which endpoint, keep the upstream's message."""
    message = f"upstream returned HTTP {status}"
    try:
        err = orjson.loads(body).get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message += f": {err['message']}"
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return APIError(status if status in (502, 503, 504) else 502, message)
