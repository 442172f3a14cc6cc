"""Active health checks: every endpoint's ``/health`` on an interval.

Passive ejection (in :mod:`gateway.upstream.pool`) reacts within a request; this loop brings an
endpoint back once it answers again and takes out one that stopped answering while idle. A passing
check also ends a passive ejection at once: a restarted endpoint is back in rotation within one
``health.interval_s`` of answering, not after whatever back-off its failures had built up.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Iterator

import aiohttp
import httpx

from gateway.config import HealthConfig
from gateway.upstream.pool import Endpoint, Pool

log = logging.getLogger("specroute.health")


async def check(client: httpx.AsyncClient, endpoint: Endpoint, health: HealthConfig) -> bool:
    url = endpoint.base_url + health.path
    cause = ""
    silent = False  # no answer in time: what a frozen server gives
    try:
        resp = await client.get(url, timeout=health.timeout_s)
        ok = resp.status_code == 200
        if not ok:
            cause = f"answered {resp.status_code}"
    except (httpx.HTTPError, OSError) as e:  # OSError: a socket or TLS error the transport let through
        ok, cause = False, failure(e, health.timeout_s)
        silent = cause == no_answer(health.timeout_s)
    except Exception as e:  # whatever else the client raises: the check got no answer
        ok, cause = False, unforeseen(e)
    if ok and endpoint.stalled:  # its server answers; its engine hangs (the scrape said so and why)
        ok, cause = False, "its engine takes no step"
    if ok != endpoint.healthy:
        if ok:
            log.warning("endpoint %s/%s is healthy", endpoint.pool, endpoint.name)
        else:
            # The operator's first question is which server and why: its URL and the cause, in the log only.
            log.warning("endpoint %s/%s is unhealthy: GET %s: %s", endpoint.pool, endpoint.name, url, cause)
    was = endpoint.healthy
    endpoint.healthy = ok
    # It stopped answering: what waited on it moves, at the second failed check in a row. One slow
    # /health (a busy API server) takes it out of rotation but does not throw away the work running
    # there; a frozen server fails the next check too. A request sent to it while it failed (panic
    # mode, for want of any other) moves at the second failed check after it was sent when the first of
    # them got no answer at all (a frozen server would hold it to timeouts.total_s); one whose checks
    # are answered, with a failing status, stays: a wrong health check is what panic mode is for. A hung
    # engine the scrape sees moves its requests at once.
    suspects, endpoint.suspects = endpoint.suspects, None
    if not ok and was:
        endpoint.suspects = set(endpoint.awaiting)
    elif not ok:
        if suspects and (moved := endpoint.unanswering(suspects)):
            log.warning(
                "endpoint %s/%s: %d request(s) waiting for its answer sent elsewhere",
                endpoint.pool,
                endpoint.name,
                moved,
            )
        if silent:
            endpoint.suspects = set(endpoint.awaiting) or None
    if ok and endpoint.ejected():
        log.warning("endpoint %s/%s passed its health check: ejection ended", endpoint.pool, endpoint.name)
        endpoint.end_ejection()
    return ok


def causes(error: BaseException) -> Iterator[BaseException]:
    """The error and what lies beneath it (aiohttp keeps the socket's error in ``os_error``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None)]


#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: the certificate is
#: trusted but names other hosts, which no CA file mends (the ``ssl`` module has no names for them)
_NAME_MISMATCH = frozenset({62, 64})


def no_answer(timeout_s: float) -> str:
    """The cause of a check that got nothing back in time, what a frozen server gives."""
    return f"no answer within {timeout_s:g} s (health.timeout_s)"


def failure(error: httpx.HTTPError | OSError, timeout_s: float) -> str:
    """A failed check's cause in words, from the socket's own error where there is one.

    httpx's aiohttp transport reports a refused connection as a connect *timeout*, so the type alone
    would send an operator looking for a slow server that is in fact not running.
    """
    for e in causes(error):
        if isinstance(e, ConnectionRefusedError):
            return "connection refused (is the server running, on this port?)"
        if isinstance(e, socket.gaierror):
            return f"cannot resolve the host name: {e.strerror}"
        if isinstance(e, ConnectionResetError):
            return "connection reset"
        if isinstance(e, aiohttp.ServerDisconnectedError):
            # httpx's aiohttp transport reports it as a connect time-out, within milliseconds
            return (
                "the server closed the connection without answering (over TLS: does it require a "
                "client certificate? upstream_tls.cert_file)"
            )
        # ssl's own errors, not aiohttp's wrappers of them (which subclass them without their fields)
        if type(e) is ssl.SSLCertVerificationError:
            why = e.verify_message or e.reason
            if e.verify_code in _NAME_MISMATCH:  # a trusted certificate, for another server
                return (
                    f"its TLS certificate does not name the host: {why} (the endpoint's URL must use a"
                    " name or address the certificate lists)"
                )
            return f"its TLS certificate is not trusted: {why} (upstream_tls.ca_file names the CA to trust)"
        if type(e) is ssl.SSLError:
            return f"TLS failed: {e.reason or e}"
    if isinstance(error, httpx.TimeoutException):
        return no_answer(timeout_s)
    return printable(str(error).strip()) or type(error).__name__


def unforeseen(error: Exception) -> str:
    """The cause of a check the client failed in a way no transport error covers, in one line.

    Such an error repeats on every check (a header the client refuses to send, a time-out it cannot
    arm), so it fails the check like any other, said once where the endpoint turns unhealthy, not as
    a traceback every ``health.interval_s``.
    """
    text = printable(" ".join(str(error).split()))
    return f"the HTTP client failed: {type(error).__name__}" + (f": {text}" if text else "")


def printable(text: str) -> str:
    """``text`` with its control characters escaped, as ``%r`` would show them, without the quotes.

    An error's text may carry what the upstream sent: a line break in it would forge a log line, an
    escape sequence would act on the terminal that shows the log.
    """
    return text if text.isprintable() else repr(text)[1:-1]


async def check_all(client: httpx.AsyncClient, pools: list[Pool], health: HealthConfig) -> None:
    """Check every endpoint; a check that fails in an unforeseen way beyond its call (the client's own
    failures fail the check) is logged and leaves its endpoint as it was, so that neither start-up nor
    the loop stops on it."""
    endpoints = [e for p in pools for e in p.endpoints]
    results = await asyncio.gather(*(check(client, e, health) for e in endpoints), return_exceptions=True)
    for endpoint, result in zip(endpoints, results, strict=True):
        if isinstance(result, Exception):
            log.error("health check of %s/%s failed", endpoint.pool, endpoint.name, exc_info=result)


async def run(
    client: httpx.AsyncClient,
    pools: list[Pool],
    health: HealthConfig,
    after_round: Callable[[], None] | None = None,
) -> None:
    """Check forever, then ``after_round`` after each round (the endpoint gauges); cancelled at shutdown."""
    while True:
        await asyncio.sleep(health.interval_s)
        await check_all(client, pools, health)
        if after_round is not None:
            after_round()
