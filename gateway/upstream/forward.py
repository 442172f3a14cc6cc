"""Forwarding one request: pick an endpoint, send, retry or fail over, stream back.

Retries happen only before the first byte has gone to the client: on a connect error, a 5xx or
429, or no first byte within ``timeouts.first_byte_s`` (and once at once, on the same endpoint, when
a connection drops before any of the response arrives); a non-streamed body that breaks on the way
is sent again too (:meth:`Upstreams.fetch`), since the client has seen none of it. A 503 or 429 says
the endpoint is busy, not broken: it gets less traffic for a while and is never ejected for it. A
streamed response is held back until its first upstream chunk has arrived, so a stream that dies
before producing anything is retried too. Both pools serve the same model, so moving a request to
the other pool changes its speed, not its answer. A request that reads a stored Responses-API
response goes first to the endpoint that made it, and on through the endpoints of both pools while
they answer 404 (:mod:`gateway.upstream.stored`). A request that changes each server's own state (vLLM's LoRA
adapter routes) goes to every endpoint once instead (:meth:`Upstreams.broadcast`). Failures are raised as
:mod:`gateway.errors`; what the client is told is the API edge's business.

Forwarding to a plain ``http://`` endpoint goes through :mod:`gateway.upstream.wire`, a lean HTTP/1.1
client (aiohttp's request machinery cost ~45 µs more CPU per request); ``https://`` endpoints go
through aiohttp's pool. Both answer with a :class:`Response`. The gateway's own calls (health checks,
scrapes, discovery) use httpx's API over aiohttp's pool.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, overload
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
from yarl import URL

from gateway.config import Settings
from gateway.errors import (
    ModelNotServed,
    NoEndpoint,
    Unreachable,
    UpstreamBroken,
    UpstreamError,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from gateway.observability import GaugeChild, Metrics
from gateway.types import OTHER_POOL, PoolName
from gateway.upstream.backoff import retry_delay
from gateway.upstream.credentials import UpstreamKeys
from gateway.upstream.deadline import Deadlines, wait_until
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.resume import Resumption, Splice
from gateway.upstream.silence import Silence
from gateway.upstream.stored import StoredResponses
from gateway.upstream.stream import DONE_EVENT, StreamMeter, leading_error, server_error
from gateway.upstream.wire import Malformed, WirePool, read_within

log = logging.getLogger("specroute.upstream")

#: an endpoint that lacks a configured model is named in the log at most this often
MISSING_LOG_S = 60.0
#: what the client is told to wait (``Retry-After``) when every try met a busy endpoint that named no
#: time of its own, or no endpoint was there to try
BUSY_RETRY_AFTER_S = 1.0
#: the longest wait an upstream's own ``Retry-After`` is passed on with
MAX_RETRY_AFTER_S = 60.0
#: the largest upstream 429 body kept for the client (vLLM's is a few hundred bytes): one held while
#: the other endpoints are tried is not a whole response's worth of memory
MAX_ERROR_BODY = 64 * 1024
#: the least of a request's time left worth another try (less would only be cut: timers may fire a
#: little early)
MIN_TRY_S = 0.01


class Headers(Protocol):
    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, /, default: str) -> str: ...


class Response(Protocol):
    """An upstream response whose head has arrived, from either client."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Headers: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive."""
        ...

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body; :class:`~gateway.upstream.wire.Malformed` when over ``limit`` bytes."""
        ...

    @property
    def arrived(self) -> bool:
        """Every byte of the body is here: reading the rest will not wait (False when unknown)."""
        ...

    def release(self) -> None:
        """Read to its end: the connection may serve another request."""
        ...

    def close(self) -> None:
        """Done with it, read or not: the connection closes (an unfinished upstream request aborts)."""
        ...


class _AiohttpResponse:
    """aiohttp's response as a :class:`Response` (``https://`` endpoints)."""

    __slots__ = ("_r",)

    def __init__(self, response: aiohttp.ClientResponse):
        self._r = response

    @property
    def status(self) -> int:
        return self._r.status

    @property
    def headers(self) -> Headers:
        return self._r.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self._r.content.iter_any()

    async def read(self, limit: int | None = None) -> bytes:
        return await read_within(self._r.content.iter_any(), limit)

    @property
    def arrived(self) -> bool:
        return False  # aiohttp does not say; the rest is read under the gap timeout

    def release(self) -> None:
        self._r.release()

    def close(self) -> None:
        self._r.close()


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the lean client sends an endpoint's requests, and the key it adds."""

    host: str
    port: int
    prefix: str  # the base URL's path, before the request's
    authorization: str | None


@dataclass(slots=True)
class Sent:
    """A response whose first bytes have arrived; the rest is still upstream."""

    endpoint: Endpoint
    response: Response
    first: bytes
    chunks: AsyncIterator[bytes]
    retries: int
    sent_at: float = 0.0

    @property
    def pool(self) -> PoolName:
        return self.endpoint.pool


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one endpoint made of a request sent to every endpoint (:meth:`Upstreams.broadcast`): its own
    whole answer below 500 (``status``, ``content_type``, ``body``: vLLM's, for the client to read), or
    the ``error`` that stands for its answer (no answer, a server error or busy status, a refusal of the
    gateway's credentials), said as to a client, never naming an address."""

    endpoint: Endpoint
    status: int = 0
    content_type: str | None = None
    body: bytes = b""
    error: UpstreamError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300


class Upstreams:
    """The pools, the shared HTTP client and the retry policy."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient,
        session: aiohttp.ClientSession,
        pools: dict[PoolName, Pool],
        metrics: Metrics,
        keys: UpstreamKeys | None = None,
    ):
        self.settings = settings
        self.client = client
        self.session = session
        self.pools = pools
        self.metrics = metrics
        self.keys = keys
        t = settings.timeouts
        # connect only: how long a response may take is the first-byte / gap / total budget's business
        self._timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_s, sock_connect=t.connect_s)
        # the most of one answer held at once (limits.max_response_bytes): a body, an event, an assembly
        self.max_response = settings.limits.max_response_bytes
        # what every request reads, read once (the settings are frozen; each attribute of a pydantic
        # model goes through its __getattr__ hook, some 500 instructions)
        self._total_s = t.total_s
        self._first_byte_s = t.first_byte_s
        self._chunk_gap_s = t.chunk_gap_s
        self._attempts = settings.retries.attempts
        self._failover = settings.retries.failover_to_other_pool
        self.wire = WirePool(connect_s=t.connect_s, max_unread=self.max_response)
        # per endpoint object: an address that discovery moves to the other pool is another endpoint,
        # so its key is looked up again (the pools' keys may differ)
        self._targets: dict[Endpoint, _Target | None] = {}
        self._missing_told: dict[str, float] = {}  # endpoint URL -> when the log last said it lacks a model
        self._refused_told: dict[str, float] = {}  # endpoint URL -> when the log last said it refused the key
        self._inflight: dict[Endpoint, GaugeChild] = {}
        # one timer per time limit: the first byte's (timeouts.first_byte_s, or timeouts.total_s for
        # non-streamed requests) and a non-streamed request's whole (timeouts.total_s)
        self._limits: dict[float, Deadlines] = {}
        self.jitter: Callable[[], float] = random.random  # draws the pause before a retry
        self.stored = StoredResponses()  # where this process saw each stored response made

    def export_state(self) -> None:
        """Set every endpoint's up and ejected gauges from its state now.

        Called at each health round and when ``/metrics`` is rendered. With several workers a scrape
        merges every worker's last values (``endpoint_ejected`` by the highest), and a worker that
        answered no scrape since an ejection ended would otherwise report it ejected for as long as
        scrapes keep going to the other workers (Prometheus keeps its connection to one).
        """
        for pool in self.pools.values():
            available = 0
            for ep in pool.endpoints:
                up = ep.available()
                available += up
                self.metrics.endpoint_up.labels(pool.name, ep.name).set(1.0 if up else 0.0)
                self.metrics.ejected.labels(pool.name, ep.name).set(1.0 if ep.ejected() else 0.0)
            self.metrics.pool_available.labels(pool.name).set(available)

    def forget(self, endpoint: Endpoint) -> None:
        """Drop what is kept of an endpoint discovery removed once it drained: its gauges
        (:meth:`Metrics.forget`), its in-flight gauge's handle, its target and the responses it stored,
        which would otherwise grow with every pod that ever served."""
        self.metrics.forget(endpoint)
        self._inflight.pop(endpoint, None)
        self._targets.pop(endpoint, None)
        self.stored.forget(endpoint)

    def _busy(self, endpoint: Endpoint, delta: int) -> None:
        """Count a request in or out of an endpoint, in the balancer and in the shared gauge.

        The gauge moves with every request (not set at scrape time) so that with several workers
        the summed value is exact.
        """
        endpoint.outstanding += delta
        gauge = self._inflight.get(endpoint)
        if gauge is None:
            series = self.metrics.inflight.labels(endpoint.pool, endpoint.name)
            gauge = self._inflight[endpoint] = GaugeChild(series)
        gauge.inc(delta)

    def _candidates(self, pool: PoolName, allow_failover: bool) -> list[PoolName]:
        if allow_failover and self._failover:
            return [pool, OTHER_POOL[pool]]
        return [pool]

    def _pick(self, names: list[PoolName], tried: list[Endpoint], panic: bool = True) -> Endpoint | None:
        """The next endpoint to try: a usable one of the pools ``names``, else (panic) any of them."""
        for name in names:
            endpoint = self.pools[name].pick(exclude=tried)
            if endpoint is not None:
                return endpoint
        if not panic or not self.settings.retries.panic:
            return None
        for name in names:
            endpoint = self.pools[name].pick(exclude=tried, panic=True)
            if endpoint is not None:
                self.metrics.panic.labels(endpoint.pool).inc()
                return endpoint
        return None

    def failed(self, endpoint: Endpoint, sent_at: float) -> None:
        """Count a failure against ``endpoint`` (a request sent at ``sent_at``), ejecting it if due."""
        if self.pools[endpoint.pool].record_failure(endpoint, self.settings.health, sent_at):
            self.metrics.ejections.labels(endpoint.pool, endpoint.name).inc()
            self.metrics.ejected.labels(endpoint.pool, endpoint.name).set(1.0)
            log.warning("ejected %s/%s after repeated failures", endpoint.pool, endpoint.name)

    async def send(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        pool: PoolName,
        allow_failover: bool = True,
        first_byte_s: float | None = None,
        tried: list[Endpoint] | None = None,
        last_error: UpstreamError | None = None,
        attempts: int | None = None,
        method: str = "POST",
        idempotent: bool = True,
        deadline: float | None = None,
        stored: str | None = None,
    ) -> Sent:
        """Send until one endpoint gives a first byte (or a 4xx); if none does, raise an
        :class:`~gateway.errors.UpstreamError`.

        A non-streamed upstream response sends its first byte only when it is complete, so callers
        pass a longer ``first_byte_s`` for those. ``tried`` lists the endpoints this request has
        already been sent to (a caller resending it passes the same list): they are not tried again,
        and they count against ``attempts`` (default ``retries.attempts``); ``last_error`` is what went
        wrong with the last of them, reported when no other endpoint is left to try. A resumed stream
        passes the endpoints that broke it and what is left of the request's budget on top of them.
        A request that is not ``idempotent`` (an unknown route passed through) is sent again only when
        no endpoint took it: refused connections and busy answers (503, 429). ``deadline`` (on the
        loop's clock) ends the whole request: no try waits for its first byte past it, and none after
        the first starts without time left for it. With failover allowed, the last try goes to the other
        pool when every try before it went to the first.

        ``stored`` is the id of the stored Responses-API response the request reads (its own route, or
        a ``previous_response_id``): the first try goes to the endpoint known to have made it, and an
        endpoint's 404 (for anything but a model it lacks) means it does not hold it: nothing ran, and
        the next try goes to another endpoint of either pool, not counted against ``attempts`` and with
        no pause. A success notes where the response is; when every endpoint said 404 (or lacks the
        model), the first 404 is the answer.
        """
        deadlines = self._deadlines(first_byte_s or self._first_byte_s)
        tried = [] if tried is None else tried
        limit = self._attempts if attempts is None else attempts
        panic = True  # until a try is cut by its endpoint's failed checks: they were right, not wrong
        names = self._candidates(pool, allow_failover)
        holder = not_found = None
        hops = 0  # tries answered "not here" (404) for a stored response: not failures, not counted
        if stored is not None:
            names = [pool, OTHER_POOL[pool]]  # looked for wherever it may be, failover or not
            holder = self.stored.holder(stored, self.pools)
        while len(tried) < limit:
            if holder is not None and holder not in tried and holder.available():
                endpoint: Endpoint | None = holder
            elif (
                len(names) > 1
                and tried
                and len(tried) == limit - 1
                and all(e.pool != names[1] for e in tried)
            ):
                # the last try goes to the other pool, which serves the same model, when the tries so far
                # all failed on the first: a pool whose every endpoint is busy, lacks the model or fails
                # had the client told so while the other pool stood idle
                endpoint = self._pick([names[1], names[0]], tried, panic)
            else:
                endpoint = self._pick(names, tried, panic)
            if endpoint is None:
                break
            attempt = len(tried)
            limit_at = None  # the try's first byte waits its own limit, unless the request ends sooner
            if deadline is not None:
                left = deadline - asyncio.get_running_loop().time()
                if attempt and left < MIN_TRY_S:
                    break  # the request's time is spent: what went wrong last is the answer
                if left < deadlines.seconds:
                    limit_at = deadline
            if attempt > hops:  # after a failure (the last try was not a 404 that sent it on)
                self.metrics.retries.labels(endpoint.pool).inc()
                retries = self.settings.retries
                if retries.backoff_s:
                    await asyncio.sleep(
                        retry_delay(attempt, retries.backoff_s, retries.backoff_max_s, self.jitter)
                    )
            tried.append(endpoint)
            self._busy(endpoint, 1)
            sent_at = time.monotonic()
            response: Response | None = None
            error: UpstreamError
            wait = deadlines.wait() if limit_at is None else wait_until(limit_at)
            awaiting = endpoint.awaiting  # a failed health check of the endpoint cuts the wait short
            awaiting.add(wait)
            try:
                with wait:
                    response = await self._post(endpoint, path, body, headers, method)
                    chunks = response.chunks()
                    if response.status >= 500 or response.status == 429:
                        retry_after = response.headers.get("retry-after")
                        raise _UpstreamStatus(
                            response.status, await response.read(self.max_response), retry_after
                        )
                    if (response.status == 401 or response.status == 403) and not self.callers_key(
                        headers, endpoint
                    ):
                        raise _Refused(response.status)
                    if response.status == 404:
                        first = await response.read(self.max_response)
                        missing = _missing_model(first)
                        if missing is not None:
                            raise _ModelMissing(missing)
                        answer = Sent(endpoint, response, first, chunks, attempt - hops, sent_at)
                        if stored is None:
                            return answer
                        # not held here: the next endpoint is asked. The first such answer (from the
                        # pool the request was sent to) is kept, whole; its connection is closed, not
                        # pooled, as the caller may close it again later
                        not_found = not_found or answer
                        self._busy(endpoint, -1)
                        response.close()
                        hops += 1
                        limit += 1
                        panic = False  # no endpoint left to ask is no reason to ask those out of rotation
                        continue
                    first = b""
                    async for piece in chunks:
                        if piece:
                            first = piece
                            break
                    if not first and response.status < 300 and idempotent and method == "POST":
                        raise _ClosedEarly  # a passed-through answer may be empty
                    opening = leading_error(first) if response.status < 300 else None
                    if opening is not None and server_error(opening):
                        # the request failed there before anything of it reached the client: sent
                        # again elsewhere, as after an HTTP 5xx
                        code = opening.get("code")
                        status = code if isinstance(code, int) and 500 <= code < 600 else 500
                        raise _UpstreamStatus(status, orjson.dumps({"error": opening}))
                if stored is not None and response.status < 300:
                    self.stored.remember(stored, endpoint)
                return Sent(endpoint, response, first, chunks, retries=attempt - hops, sent_at=sent_at)
            except _UpstreamStatus as e:
                kind, error = "status_5xx", _reported_status(e.status, e.body, endpoint)
                if e.status in _BUSY:
                    kind = "busy"
                    error.retry_after_s = _seconds(e.retry_after) or BUSY_RETRY_AFTER_S
            except _ModelMissing as e:
                # the configuration says this model is served: this endpoint lacks it (mid-rollout, a
                # LoRA adapter not loaded here). Nothing ran: sent elsewhere, never ejected for it
                kind, error = "model_missing", ModelNotServed(e.message)
                now = time.monotonic()
                if now - self._missing_told.get(endpoint.base_url, -MISSING_LOG_S) >= MISSING_LOG_S:
                    self._missing_told[endpoint.base_url] = now  # once a minute: every request meets it
                    log.warning(
                        "endpoint %s/%s does not serve the model a request named (%r); sent elsewhere",
                        endpoint.pool,
                        endpoint.name,
                        error.message,
                    )
            except _Refused as e:
                # the endpoint refused the gateway's own credentials (vLLM's --api-key): a configuration
                # to fix, not the client's key to blame. Nothing ran: sent elsewhere, never ejected for it
                # (its /health is open, so checks would let it straight back)
                kind, error = "unauthorized", self._refusal(endpoint, e.status)
            except _ClosedEarly:
                kind, error = "protocol", UpstreamBroken("the upstream's answer was empty")
            except _DroppedAgain:  # before _UNREACHABLE: the endpoint took the connection and dropped it
                kind = "dropped_connection"
                error = UpstreamBroken("the upstream closed the connection before answering")
            except _UNREACHABLE:  # before TimeoutError: aiohttp's connect time-out is one too
                if response is None:
                    kind = "connect"
                    # nothing ran: as with no endpoint to try, the client may come back shortly
                    error = Unreachable("no upstream endpoint could be reached", BUSY_RETRY_AFTER_S)
                else:  # the endpoint answered; its answer broke off before the first byte of its body
                    kind = "protocol"
                    error = UpstreamBroken("the upstream's answer broke off before its body")
            except TimeoutError:
                if wait in awaiting:
                    kind = "timeout"
                    error = UpstreamTimeout("the upstream sent nothing in time")
                else:  # taken out of the set by Endpoint.unanswering: the endpoint stopped answering
                    # its checks. No time limit was reached: when no other endpoint answers, the client
                    # is told the service is unavailable for now, not that it timed out
                    kind, panic = "unhealthy", False
                    error = Unreachable(
                        "the upstream stopped answering its health checks", BUSY_RETRY_AFTER_S
                    )
            except Malformed as e:
                kind = "protocol"
                error = UpstreamBroken(f"the upstream's answer was not valid HTTP: {e}")
            except aiohttp.ClientError as e:
                kind = "protocol"
                error = UpstreamBroken(f"the upstream connection failed: {type(e).__name__}")
            except BaseException:  # cancelled: the client went away; closing aborts the upstream request
                self._busy(endpoint, -1)
                if response is not None:
                    response.close()
                raise
            finally:
                awaiting.discard(wait)
            self._busy(endpoint, -1)
            if response is not None:
                response.close()
            self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, kind).inc()
            # overloaded, not broken: less traffic for a while, no ejection. A first byte that did not
            # come while vLLM queued requests is its queue's wait: ejecting the endpoint for that would
            # pile its load on the others, each in turn, and an overloaded pool would flap
            if kind == "busy" or (kind == "timeout" and endpoint.queueing):
                endpoint.mark_busy(self.settings.health)
            elif kind != "model_missing" and kind != "unauthorized":  # it serves its other models
                self.failed(endpoint, sent_at)
            if last_error is None or _telling(error) >= _telling(last_error):
                last_error = error
            if not idempotent and kind not in ("connect", "busy", "model_missing", "unauthorized"):
                break  # it may have been acted on: not sent again
        if not_found is not None and (last_error is None or _telling(last_error) == 0):
            # every endpoint asked said the response is not there: vLLM's 404 as it wrote it (its
            # connection was let go; the caller counts it out again as it reads it)
            self._busy(not_found.endpoint, 1)
            return not_found
        if last_error is None:
            raise NoEndpoint(
                "no healthy upstream endpoint is available; try again shortly", BUSY_RETRY_AFTER_S
            )
        raise last_error

    async def fetch(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        pool: PoolName,
        allow_failover: bool = True,
        first_byte_s: float | None = None,
        method: str = "POST",
        idempotent: bool = True,
        tried: list[Endpoint] | None = None,
        stored: str | None = None,
    ) -> tuple[Sent, bytes]:
        """A whole non-streamed response: sent again elsewhere if its body breaks on the way.

        The client has received nothing yet, so a body cut by a reset or a silence longer than
        ``timeouts.chunk_gap_s``, or a success whose JSON is not whole, is as safe to resend as a
        failed connect; the resends come out of the same ``retries.attempts``. All the tries and the
        reading of the answer end within ``timeouts.total_s`` (one hung endpoint after another, or a
        body that comes a byte at a time, would otherwise hold the request for as long as they last).
        ``tried``, when given, is filled with the endpoints it was sent to, and ``stored`` names the
        stored response the request reads, as in :meth:`send`.
        """
        tried = [] if tried is None else tried
        error: UpstreamError | None = None
        loop = asyncio.get_running_loop()
        total_s = self._total_s
        deadline = self.deadline()
        try:
            while True:
                sent = await self.send(
                    path,
                    body,
                    headers,
                    pool,
                    allow_failover,
                    first_byte_s,
                    tried,
                    error,
                    None,
                    method,
                    idempotent,
                    deadline,
                    stored,
                )
                try:
                    content = await self.read_all(sent, deadline)
                    # vLLM's JSON answers are objects: two byte tests pass them, the fuller test the rest
                    whole = content.endswith(b"}") and content.startswith(b"{")
                    if (
                        not whole
                        and sent.response.status < 300
                        and not _whole_json(content, sent.response.headers)
                    ):
                        self._protocol_error(sent)
                        raise UpstreamBroken("the upstream's answer was not the whole JSON it announced")
                    return sent, content
                except UpstreamError as e:
                    if not idempotent or not self.can_retry(tried) or isinstance(e, UpstreamTooLarge):
                        raise
                    error = e
        except UpstreamTimeout:
            if loop.time() < deadline - MIN_TRY_S:
                raise
            raise UpstreamTimeout(f"no complete answer from the upstream within {total_s:g} s") from None

    def everywhere(self) -> list[Endpoint]:
        """Every endpoint of both pools, in or out of rotation, but those discovery has dropped and that
        only finish their requests (draining): what serves the model now or will again."""
        return [ep for pool in self.pools.values() for ep in pool.endpoints if not ep.draining]

    async def broadcast(
        self, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> list[Delivery]:
        """Send one request to every endpoint of :meth:`everywhere` at once, each with its own
        credentials, and read each one's whole answer within ``timeouts.total_s``: one
        :class:`Delivery` per endpoint, in their order.

        For a request that changes one server's own state and must reach each (vLLM's LoRA adapter
        routes): one endpoint's answer stands for none of the others, so a failed one is not sent
        elsewhere, and none is sent twice (a second load of an adapter is an error, "already loaded").
        An endpoint that fails it is not marked failed: this is no traffic, and its health checks say
        whether it serves. Raises :class:`~gateway.errors.NoEndpoint` when the pools have none.
        """
        endpoints = self.everywhere()
        if not endpoints:
            raise NoEndpoint("no upstream endpoint is known; try again shortly", BUSY_RETRY_AFTER_S)
        deadline = self.deadline()
        sends = (self._deliver(ep, path, body, headers, method, deadline) for ep in endpoints)
        return list(await asyncio.gather(*sends))

    async def _deliver(
        self,
        endpoint: Endpoint,
        path: str,
        body: bytes,
        headers: dict[str, str],
        method: str,
        deadline: float,
    ) -> Delivery:
        """One try of a broadcast request at one endpoint, read whole by ``deadline`` (loop clock)."""
        self._busy(endpoint, 1)
        response: Response | None = None
        complete = False
        kind = "protocol"  # unless the failure says otherwise
        error: UpstreamError | None = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._post(endpoint, path, body, headers, method)
                content = await response.read(self.max_response)
            complete = True
        except _DroppedAgain:  # before _UNREACHABLE, as in send
            kind = "dropped_connection"
            error = UpstreamBroken("the upstream closed the connection before answering")
        except _UNREACHABLE:  # before TimeoutError: aiohttp's connect time-out is one too
            if response is None:
                kind, error = "connect", Unreachable("the upstream could not be reached")
            else:
                error = UpstreamBroken("the upstream's answer broke off")
        except TimeoutError:
            kind, error = "timeout", UpstreamTimeout(f"no whole answer within {self._total_s:g} s")
        except Malformed as e:
            error = UpstreamBroken(f"the upstream's answer was not valid HTTP: {e}")
        except aiohttp.ClientError as e:
            error = UpstreamBroken(f"the upstream connection failed: {type(e).__name__}")
        finally:
            self._busy(endpoint, -1)
            if response is not None:
                _close(response, complete)
        if error is not None or response is None:
            return self._undelivered(endpoint, kind, error or UpstreamBroken("the upstream did not answer"))
        return self._delivered(endpoint, headers, response, content)

    def _delivered(
        self, endpoint: Endpoint, headers: Mapping[str, str], response: Response, content: bytes
    ) -> Delivery:
        """A broadcast request's whole answer from ``endpoint``: its own below 500, but for a refusal of
        the gateway's credentials (a configuration to fix, not the client's key); else its failure."""
        status = response.status
        if status >= 500 or status == 429:
            kind = "busy" if status in _BUSY else "status_5xx"
            return self._undelivered(endpoint, kind, _reported_status(status, content, endpoint))
        if (status == 401 or status == 403) and not self.callers_key(headers, endpoint):
            return self._undelivered(endpoint, "unauthorized", self._refusal(endpoint, status))
        return Delivery(endpoint, status, response.headers.get("content-type"), content)

    def _undelivered(self, endpoint: Endpoint, kind: str, error: UpstreamError) -> Delivery:
        """Count a broadcast request's failure at ``endpoint`` (``specroute_upstream_errors_total``)."""
        self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, kind).inc()
        return Delivery(endpoint, error=error)

    def deadline(self) -> float:
        """When a request that starts now must be over, on the loop's clock (``timeouts.total_s``): what
        :meth:`send` and :meth:`relay` take, so that the tries, the wait for the first byte and the
        stream together last no longer."""
        return asyncio.get_running_loop().time() + self._total_s

    def _too_large(self, sent: Sent, what: str) -> UpstreamTooLarge:
        """Count and log an answer larger than ``limits.max_response_bytes``; the error that ends it.
        The endpoint is not at fault (the request asked for that much): it is not marked failed."""
        self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "too_large").inc()
        limit = self.max_response
        log.warning(
            "%s from %s/%s over limits.max_response_bytes (%d)", what, sent.pool, sent.endpoint.name, limit
        )
        return UpstreamTooLarge(f"the upstream's answer is larger than the gateway may hold ({limit} bytes)")

    def _protocol_error(self, sent: Sent) -> None:
        self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "protocol").inc()
        self.failed(sent.endpoint, sent.sent_at)

    def _deadlines(self, seconds: float) -> Deadlines:
        """The one timer for every wait of ``seconds`` (see :mod:`gateway.upstream.deadline`)."""
        deadlines = self._limits.get(seconds)
        if deadlines is None:
            deadlines = self._limits[seconds] = Deadlines(seconds)
        return deadlines

    def can_retry(self, tried: list[Endpoint]) -> bool:
        """Whether a request already sent to ``tried`` may go out once more."""
        return len(tried) < self._attempts

    def callers_key(self, headers: Mapping[str, str], endpoint: Endpoint) -> bool:
        """Whether a request went upstream with its caller's ``Authorization`` (forwarded, and no key of
        the endpoint's own replacing it): then a 401 is the caller's to read, as vLLM wrote it."""
        return "authorization" in headers and not self.own_key(endpoint)

    def own_key(self, endpoint: Endpoint) -> bool:
        """Whether the gateway sends ``endpoint`` a key of its own (``api_key_env``/``api_key_file``), in
        place of any caller's."""
        return self.keys is not None and self.keys.key_for(URL(endpoint.base_url)) is not None

    def _refusal(self, endpoint: Endpoint, status: int) -> UpstreamStatus:
        """The error of an endpoint that refused the gateway's own credentials (vLLM's ``--api-key``): a
        configuration to fix, not the client's key to blame; told in the log once a minute per endpoint
        (every request meets it), naming the settings."""
        now = time.monotonic()
        if now - self._refused_told.get(endpoint.base_url, -MISSING_LOG_S) >= MISSING_LOG_S:
            self._refused_told[endpoint.base_url] = now
            log.warning(
                "endpoint %s/%s refused the gateway's credentials (HTTP %d): configure the key its "
                "vLLM was started with (--api-key) as the pool's or endpoint's api_key_env or "
                "api_key_file",
                endpoint.pool,
                endpoint.name,
                status,
            )
        return UpstreamStatus(502, f"the upstream refused the gateway's credentials (HTTP {status})")

    def _target(self, endpoint: Endpoint) -> _Target | None:
        """The lean client's target for ``endpoint``; None sends its requests through aiohttp (TLS)."""
        if endpoint in self._targets:
            return self._targets[endpoint]
        base = endpoint.base_url
        url = urlsplit(base)
        target: _Target | None = None
        if url.scheme == "http" and url.hostname and not url.query and not url.fragment:
            key = self.keys.key_for(URL(base)) if self.keys else None
            target = _Target(
                host=url.hostname,
                port=url.port or 80,
                prefix=url.path.rstrip("/"),
                authorization=None if key is None else "Bearer " + key.get_secret_value(),
            )
        if len(self._targets) > 4096:  # discovered endpoints come and go
            self._targets.clear()
        self._targets[endpoint] = target
        return target

    async def _post(
        self, endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> Response:
        """POST, and once more if the connection dropped before any of the response arrived.

        A pooled keep-alive connection that the server closes just as a request goes out on it (vLLM
        and uvicorn drop idle ones after 5 s) fails this way through no fault of the endpoint, so the
        second try, on a new connection, does not count against it: not on another idle one, which the
        same server (a reload, a balancer clearing idle connections) may have closed at the same moment.
        aiohttp retries such failures itself only for idempotent methods; a completion is as safe to
        resend, and a second failure is handled as usual. A refused connection is not retried here: the
        endpoint is not there.
        """

        target = self._target(endpoint)
        sent: Mapping[str, str] = headers
        if target is not None and target.authorization is not None:  # the endpoint's key, not the caller's
            sent = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            sent["authorization"] = target.authorization

        def post(fresh: bool = False) -> Awaitable[Response]:
            if target is not None:
                url = target.prefix + path
                return self.wire.request(method, target.host, target.port, url, sent, body, fresh=fresh)
            # aiohttp's pool has no per-request choice of connection: an https endpoint's retry takes
            # whichever it gives (it drops the idle connections whose close it has already read)
            return self._aiohttp(method, endpoint.base_url + path, body, headers)

        try:
            return await post()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if isinstance(e, aiohttp.ClientConnectorError):
                raise
            self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, "dropped_connection").inc()
            try:
                return await post(fresh=True)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as again:
                if target is None or isinstance(again, aiohttp.ClientConnectorError):
                    # through aiohttp (TLS) the resend may not have had a new connection, and a server
                    # that refuses the gateway's certificate drops it after the handshake: not reached
                    raise
                raise _DroppedAgain(str(again)) from again

    async def _aiohttp(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        # decoded here, unlike the session's other calls (httpx decodes those itself): the gateway relays
        # the content type only, so a body compressed against the request's ``identity`` must be read plain
        response = await self.session.request(
            method,
            url,
            data=body,
            headers=headers,
            timeout=self._timeout,
            allow_redirects=False,
            auto_decompress=True,
        )
        return _AiohttpResponse(response)

    def close(self) -> None:
        """Close the lean client's connections (aiohttp's pool closes with the session) and stop the
        first-byte timers."""
        self.wire.close()
        for deadlines in self._limits.values():
            deadlines.close()

    async def relay(
        self,
        sent: Sent,
        meter: StreamMeter | None,
        on_done: Callable[[Sent, int | None], None],
        resume: Resumption | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[bytes]:
        """Yield the response to the client chunk by chunk, enforcing gap and total timeouts.

        ``deadline`` (on the loop's clock; see :meth:`deadline`) ends the whole request, its wait for
        the first byte included; without it the stream may last ``timeouts.total_s`` from now.

        A stream that breaks (reset, gap timeout) goes on on another endpoint when ``resume`` says
        how (:mod:`gateway.upstream.resume`); otherwise it raises :class:`~gateway.errors.UpstreamBroken`
        (or ``UpstreamTimeout``) after the last whole event, and the API edge ends it. ``on_done``
        runs exactly once, with the endpoint that served the end of the stream and the error
        status when the stream broke.
        """
        timeouts = self.settings.timeouts
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + timeouts.total_s
        silence = Silence(timeouts.chunk_gap_s, deadline)
        failed: int | None = None
        cut = False  # the upstream broke off after the client's answer was whole
        splice: Splice | None = None
        piece = sent.first
        limit = self.max_response
        assembled = 0  # bytes of a stream read into one body (the meter collects its chunks)
        try:
            while True:
                if splice is not None:
                    piece = splice.feed(piece)
                out = meter.feed(piece) if meter else piece
                if meter is not None and (
                    meter.unfinished() > limit
                    or (meter.collect is not None and (assembled := assembled + len(piece)) > limit)
                ):
                    # an event that never ends, or a body to assemble that never ends, is not held
                    # until memory runs out
                    failed = 502
                    meter.discard_partial()
                    raise self._too_large(sent, "stream")
                if out:
                    yield out
                try:
                    piece = await silence.next(sent.chunks)
                    continue
                except StopAsyncIteration:
                    if meter is not None and not meter.done and meter.unfinished():
                        # the body's last event came without the blank line that ends it ("data: [DONE]"
                        # and the end of the body): whole for any client that reads to the end
                        tail = meter.end()
                        if tail:
                            yield tail
                    if meter is None or meter.done or meter.error is not None:
                        break
                    # the body ended in good order but the stream did not ([DONE], a Responses stream's
                    # final event): the answer is cut short, as by a broken connection
                    failed, kind = 502, "stream"
                    message = "upstream stream ended before its end; the response is incomplete"
                    self.failed(sent.endpoint, sent.sent_at)
                except TimeoutError:
                    if meter is not None and meter.done:
                        break  # [DONE] has gone out: the client has the whole answer
                    failed, kind = 504, "timeout"
                    message = "upstream stopped sending; the response is incomplete"
                except aiohttp.ClientError:
                    if meter is not None and meter.done:
                        break  # a connection that breaks after [DONE] (before the body's end) lost nothing
                    failed, kind = 502, "stream"
                    message = "upstream connection broke; the response is incomplete"
                    self.failed(sent.endpoint, sent.sent_at)
                self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, kind).inc()
                if meter is None:
                    break
                meter.discard_partial()
                if meter.answered():
                    # what broke was only the tail the gateway asked for itself (usage, [DONE]): the
                    # client gets its whole answer and the end it expects
                    yield meter.flush() + DONE_EVENT
                    failed, cut = None, True
                    break
                resumed = None
                if resume is not None and deadline > loop.time():
                    resumed = await self._resume(sent, resume, deadline - loop.time())
                else:  # refused before it began (logprobs, several choices, ...), or out of time
                    outcome = "refused" if resume is None else "failed"
                    self.metrics.stream_resumptions.labels(sent.pool, outcome).inc()
                if resumed is None:  # the API edge ends the client's stream with an error event
                    raise (UpstreamTimeout if failed == 504 else UpstreamBroken)(message)
                assert resume is not None
                self._busy(sent.endpoint, -1)
                _close(sent.response, complete=False)
                sent, failed, piece = resumed, None, resumed.first
                splice = resume.splice()
            if failed is None and meter and not cut:
                rest = meter.flush()
                if rest:
                    yield rest
        except (asyncio.CancelledError, GeneratorExit):
            failed = 499  # the client went away; closing the upstream response aborts its request
            raise
        finally:
            silence.close()
            self._busy(sent.endpoint, -1)
            _close(sent.response, complete=failed is None and not cut)
            if failed is None and not cut:
                if meter is not None and meter.error is not None and server_error(meter.error):
                    # the server failed the request mid-stream (vLLM's error event after a 200): counted
                    # against the endpoint like a broken stream, so one that keeps failing is ejected,
                    # and the request's status is that of a broken stream, not the 200 its head said
                    self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "status_5xx").inc()
                    self.failed(sent.endpoint, sent.sent_at)
                    failed = 502
                else:
                    sent.endpoint.record_success()
            on_done(sent, failed)

    async def _resume(self, sent: Sent, resume: Resumption, time_left: float) -> Sent | None:
        """Continue a broken stream on another endpoint, within the request's attempts and time."""
        pool = sent.pool
        if not resume.attempts_used:
            resume.attempts_used = sent.retries + 1
        resume.broken.append(sent.endpoint)
        left = self._attempts - resume.attempts_used
        body = resume.body()
        if body is None or left < 1:
            why = resume.transcript.blocked or ("no attempts left" if left < 1 else "not continuable")
            log.info("stream from %s/%s not resumed: %s", pool, sent.endpoint.name, why)
            self.metrics.stream_resumptions.labels(pool, "refused").inc()
            return None
        new: Sent | None = None
        tried = list(resume.broken)
        try:
            async with asyncio.timeout(time_left):
                new = await self.send(
                    resume.path,
                    body,
                    resume.headers,
                    pool,
                    allow_failover=resume.failover,
                    tried=tried,
                    attempts=len(tried) + left,
                )
        except (UpstreamError, TimeoutError) as e:
            log.warning("stream from %s/%s could not be resumed: %s", pool, sent.endpoint.name, e)
        if new is not None:
            resume.attempts_used += new.retries - len(resume.broken) + 1
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

    async def read_all(self, sent: Sent, deadline: float = float("inf")) -> bytes:
        """The rest of a non-streamed body, within the gap timeout between reads and by ``deadline``
        (on the loop's clock)."""
        parts = [sent.first]
        complete = False
        # most non-streamed answers arrive in one read: with the whole body here, nothing is timed
        gap_s = self._chunk_gap_s
        silence = None if sent.response.arrived else Silence(gap_s, deadline)
        limit = self.max_response
        try:
            if silence is None:
                parts.extend([piece async for piece in sent.chunks])
                size = sum(map(len, parts))
            else:
                size = len(sent.first)
                while True:
                    try:
                        piece = await silence.next(sent.chunks)
                    except StopAsyncIteration:
                        break
                    size += len(piece)
                    if size > limit:
                        break
                    parts.append(piece)
            if size > limit:
                raise self._too_large(sent, "answer")
            complete = True
        except TimeoutError:
            self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "timeout").inc()
            self.failed(sent.endpoint, sent.sent_at)
            raise UpstreamTimeout("the upstream stopped sending") from None
        except aiohttp.ClientError:
            self.metrics.upstream_errors.labels(sent.pool, sent.endpoint.name, "stream").inc()
            self.failed(sent.endpoint, sent.sent_at)
            raise UpstreamBroken("the upstream broke the connection") from None
        finally:
            if silence is not None:
                silence.close()
            self._busy(sent.endpoint, -1)
            _close(sent.response, complete)
        sent.endpoint.record_success()
        return b"".join(parts)


def _whole_json(content: bytes, headers: Headers) -> bool:
    """Whether a success that says it is JSON looks whole: an object (or array) from its first byte to
    its last. A test of the ends, not a parse (a body of megabytes of embeddings stays cheap), which a
    body cut short at the length the upstream announced, or a proxy's HTML page, fails."""
    if not headers.get("content-type", "").startswith("application/json"):
        return True
    first, last = content[:64].lstrip()[:1], content[-64:].rstrip()[-1:]
    return (first == b"{" and last == b"}") or (first == b"[" and last == b"]")


def _close(response: Response, complete: bool) -> None:
    """A complete response's connection goes back to the pool; an unfinished one is closed, which
    aborts the upstream request (vLLM stops generating for a client that went away)."""
    if complete:
        response.release()
    else:
        response.close()


class _ClosedEarly(aiohttp.ClientConnectionError):
    """The upstream ended a successful response without sending a byte of its body."""


# Failures before the response's head that mean "nobody answered": refused, reset, a pooled keep-alive
# connection found dead, or closed mid-headers. Safe to retry; when every attempt ends so, the gateway
# says 503. After the head they mean the endpoint answered and broke off: a protocol failure, a 502.
_UNREACHABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class _DroppedAgain(aiohttp.ClientError):
    """A request's connection dropped before any answer, and so did the new one it was resent on: the
    endpoint accepts connections and closes them (a failing server, not a stale keep-alive connection)."""


# Upstream statuses that mean "busy, try elsewhere" rather than "broken".
_BUSY = (503, 429)


class _Refused(Exception):
    """An endpoint answered 401 or 403 to credentials that were not the caller's."""

    def __init__(self, status: int):
        self.status = status


class _ModelMissing(Exception):
    def __init__(self, message: str):
        self.message = message


def _missing_model(body: bytes) -> str | None:
    """The message of vLLM's 404 for a model it does not serve (``param: "model"``), for the client (a
    4xx's text is the client's to read); None for any other 404, such as a route it lacks."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(error, dict) or error.get("param") != "model":
        return None
    message = error.get("message")
    return message if isinstance(message, str) and message else "the model is not served by any endpoint"


class _UpstreamStatus(Exception):
    def __init__(self, status: int, body: bytes, retry_after: str | None = None):
        self.status = status
        self.body = body
        self.retry_after = retry_after


def _seconds(retry_after: str | None) -> float | None:
    """An upstream's ``Retry-After`` in seconds (its delta-seconds form; a date is not read), capped."""
    if retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        return None
    return min(seconds, MAX_RETRY_AFTER_S) if seconds > 0 else None


def _telling(error: UpstreamError) -> int:
    """How much a failed try says about the request: the client is told the most telling of its tries.

    An upstream's own answer (a server error, busy with its Retry-After) says most; then one that was
    reached but failed (no first byte in time, a broken or malformed answer); then one that could not be
    reached; least, an endpoint without the model (another one in the configuration serves it). Among
    equals the later try is told. Reporting the last try alone told a client "no upstream endpoint could
    be reached" after one had answered busy, or "model not served" when the endpoint that served it
    timed out.
    """
    if isinstance(error, UpstreamStatus):
        return 3
    if isinstance(error, (UpstreamTimeout, UpstreamBroken)):
        return 2
    if isinstance(error, Unreachable):
        return 1
    return 0


def _reported_status(status: int, body: bytes, endpoint: Endpoint) -> UpstreamStatus:
    """A 5xx or 429 that will not be retried again: what the client is told if no other try answers.

    A 5xx gets a generic message: the upstream's own text (a stack trace, a path, an internal address)
    goes to the log only. A 429 is a 4xx, the client's to read: vLLM's own OpenAI-shaped body (up to
    :data:`MAX_ERROR_BODY` bytes) is kept to go to the client as it came, its message the error's.
    """
    text = body[:2000].decode("utf-8", "replace")
    err = None
    try:
        err = orjson.loads(body).get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"][:2000]
    except (orjson.JSONDecodeError, AttributeError):
        pass
    log.warning("%s/%s returned HTTP %d: %r", endpoint.pool, endpoint.name, status, text)  # one line
    if status == 429 and isinstance(err, dict) and len(body) <= MAX_ERROR_BODY:
        return UpstreamStatus(status, text, body=body)
    return UpstreamStatus(status, f"the upstream returned HTTP {status}")
