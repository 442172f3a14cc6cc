"""Which endpoint holds each stored Responses-API response.

vLLM (with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) keeps the responses it made in its own memory:
``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and a new request naming the id as its
``previous_response_id`` work only on the server that made it, and any other answers 404. The gateway
notes where each response was made (:class:`StoredResponses`) and sends those requests there first.

The note is this process's alone: another worker, or the gateway before a restart, made responses it
never saw. Such an id, or one whose endpoint answers 404, is looked for on the other endpoints in
turn (:meth:`~gateway.upstream.forward.Upstreams.send` with ``stored``): vLLM looks the id up before
it does anything, so a 404 did nothing and the next try is safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

from gateway.types import PoolName
from gateway.upstream.pool import Endpoint, Pool

#: how many response ids are kept (the least recently used go first): at some 200 bytes each, a few MB
CAPACITY = 32768

# vLLM writes a response's id first ({"id":"resp_...",...}): read without parsing the whole body
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"')


class StoredResponses:
    """Response id -> the endpoint that made it, the least recently used dropped past ``capacity``.

    A plain dict keeps insertion order: a use moves an id to its end, and the first is the oldest.
    """

    __slots__ = ("_capacity", "_where")

    def __init__(self, capacity: int = CAPACITY):
        self._capacity = capacity
        self._where: dict[str, Endpoint] = {}

    def __len__(self) -> int:
        return len(self._where)

    def remember(self, response_id: str, endpoint: Endpoint) -> None:
        """``endpoint`` made (or holds) the response ``response_id``."""
        where = self._where
        where.pop(response_id, None)
        where[response_id] = endpoint
        if len(where) > self._capacity:
            del where[next(iter(where))]

    def holder(self, response_id: str, pools: Mapping[PoolName, Pool]) -> Endpoint | None:
        """The endpoint that made ``response_id``, while it is still one of its pool's; None if unknown.

        An endpoint that left its pool (discovery removed it, or moved its address to the other pool)
        is not sent anything more: the id is then looked for everywhere, like one never seen.
        """
        endpoint = self._where.pop(response_id, None)
        if endpoint is None:
            return None
        pool = pools.get(endpoint.pool)
        if endpoint.draining or pool is None or not any(e is endpoint for e in pool.endpoints):
            return None
        self._where[response_id] = endpoint  # used: the most recent now
        return endpoint

    def forget(self, endpoint: Endpoint) -> None:
        """Drop every id ``endpoint`` made: it left for good, and its memory with it."""
        gone = [rid for rid, e in self._where.items() if e is endpoint]
        for rid in gone:
            del self._where[rid]


def response_id(body: bytes) -> str | None:
    """The ``id`` of a Responses-API answer (a JSON object); None when it has none."""
    found = _LEADING_ID.match(body)
    if found is not None:
        return found.group(1).decode("utf-8", "replace")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    rid = value.get("id") if isinstance(value, dict) else None
    return rid if isinstance(rid, str) and rid else None
