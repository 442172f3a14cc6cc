"""Stored Responses-API responses through the gateway: each lives on the endpoint that made it.

The upstreams here store responses as vLLM does with ``VLLM_ENABLE_RESPONSES_API_STORE=1``: in their
own memory, so ``GET /v1/responses/{id}``, ``.../cancel`` and a ``previous_response_id`` work on the
server that made the response and are a 404 anywhere else. Two endpoints per pool, so that landing on
the right one is never luck.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI

from gateway.app import create_app, fast_path
from gateway.config import load_settings
from gateway.stack import demo_config, free_port
from tests.api.conftest import read_body

MODEL = "demo-model"
FORCE_SPEC = {"x-specroute-pool": "speculative"}


class Storing:
    """A vLLM-shaped upstream that keeps the responses it makes and notes every request to them."""

    def __init__(self, name: str, log: list[tuple[str, str, str]]):
        self.name = name
        self.store: dict[str, dict[str, Any]] = {}
        self.log = log  # (name, method, path) of every /v1/responses request to any of the fleet, in order
        self.made = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        method, path = scope["method"], scope["path"]
        if not path.startswith("/v1/responses"):
            await _answer(send, 200, b"", "text/plain")  # /health, /metrics
            return
        self.log.append((self.name, method, path))
        parts = path.removeprefix("/v1/responses").strip("/").split("/")
        if method == "POST" and parts == [""]:
            await self._create(orjson.loads(body), send)
            return
        response = self.store.get(parts[0])
        if response is None:
            await _not_found(send, parts[0])
        elif method == "POST" and parts[1:] == ["cancel"]:
            response["status"] = "cancelled"
            await _answer(send, 200, orjson.dumps(response))
        else:
            await _answer(send, 200, orjson.dumps(response))

    async def _create(self, request: dict[str, Any], send: Any) -> None:
        previous = request.get("previous_response_id")
        if previous is not None and previous not in self.store:
            await _not_found(send, previous)  # vLLM looks it up before it generates anything
            return
        self.made += 1
        rid = f"resp_{self.name}_{self.made}"
        response: dict[str, Any] = {"id": rid, "object": "response", "status": "completed", "model": MODEL}
        response["previous_response_id"] = previous
        response["output"] = [{"type": "message", "content": [{"type": "output_text", "text": "Hi."}]}]
        response["usage"] = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
        self.store[rid] = response
        if not request.get("stream"):
            await _answer(send, 200, orjson.dumps(response))
            return
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": {**response, "status": "in_progress", "output": []}}),
            ("response.output_text.delta", {"delta": "Hi."}),
            ("response.completed", {"response": response}),
        ]
        head = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        for i, (kind, data) in enumerate(events):
            event = orjson.dumps({"type": kind, "sequence_number": i, **data})
            chunk = b"event: " + kind.encode() + b"\ndata: " + event + b"\n\n"
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _answer(send: Any, status: int, body: bytes, media_type: str = "application/json") -> None:
    head = [(b"content-type", media_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def _not_found(send: Any, rid: str) -> None:
    """vLLM's answer for a response id it does not hold."""
    message = f"Response with id '{rid}' not found."
    error = {"message": message, "type": "invalid_request_error", "param": "response_id", "code": 404}
    await _answer(send, 404, orjson.dumps({"error": error}))


class Fleet:
    """Two storing endpoints per pool on loopback, and gateways (workers) over them."""

    def __init__(self, exits: AsyncExitStack, strategy: str):
        self.exits = exits
        self.strategy = strategy
        self.log: list[tuple[str, str, str]] = []
        self.spec = [Storing("spec0", self.log), Storing("spec1", self.log)]
        self.base = [Storing("base0", self.log), Storing("base1", self.log)]
        self.urls: dict[str, list[str]] = {"spec": [], "base": []}

    @property
    def all(self) -> list[Storing]:
        return self.spec + self.base

    def holder(self, rid: str) -> Storing:
        return next(u for u in self.all if rid in u.store)

    def asked(self, method: str, path: str) -> list[str]:
        """The upstreams that saw ``method path``, in the order they saw it."""
        return [name for name, m, p in self.log if (m, p) == (method, path)]

    async def serve(self) -> None:
        for key, upstreams in (("spec", self.spec), ("base", self.base)):
            for upstream in upstreams:
                sock = socket.create_server(("127.0.0.1", 0))
                server = uvicorn.Server(uvicorn.Config(upstream, log_level="error", lifespan="off"))
                task = asyncio.create_task(server.serve(sockets=[sock]))
                self.exits.push_async_callback(_stop, server, task)
                self.urls[key].append(f"http://127.0.0.1:{sock.getsockname()[1]}")

    async def worker(self) -> httpx.AsyncClient:
        """A gateway process of its own over the fleet: it shares nothing with the others."""
        extra: dict[str, object] = {"logging": {"access_log": False}}
        config = demo_config(self.urls["spec"], self.urls["base"], free_port(), MODEL, self.strategy, extra)
        app: FastAPI = create_app(load_settings(overrides=config))
        await self.exits.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=fast_path(app))
        client = httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30)
        return await self.exits.enter_async_context(client)


async def _stop(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    server.should_exit = True
    await task


@asynccontextmanager
async def fleet(strategy: str = "always-baseline") -> AsyncIterator[Fleet]:
    """The fleet, serving; under ``always-baseline`` the classifier never sends a request to speculative."""
    async with AsyncExitStack() as exits:
        f = Fleet(exits, strategy)
        await f.serve()
        yield f


async def _create(gw: httpx.AsyncClient, stream: bool = False, **extra: Any) -> str:
    """A response made on a speculative endpoint (the pool forced); its id."""
    body = {"model": MODEL, "input": "Say hi.", "stream": stream, **extra}
    r = await gw.post("/v1/responses", json=body, headers=FORCE_SPEC)
    assert r.status_code == 200, r.text
    if not stream:
        return str(r.json()["id"])
    created = r.text.split("\n\n")[0].split("\ndata: ", 1)[1]
    return str(orjson.loads(created)["response"]["id"])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stored_response_is_read_and_cancelled_on_the_endpoint_that_made_it(stream: bool) -> None:
    async with fleet() as f:
        gw = await f.worker()
        for _ in range(3):
            rid = await _create(gw, stream)
            maker = f.holder(rid).name
            got = await gw.get(f"/v1/responses/{rid}")
            assert got.status_code == 200, got.text
            assert got.json()["id"] == rid and got.headers["x-specroute-pool"] == "speculative"
            assert f.asked("GET", f"/v1/responses/{rid}") == [maker]  # no other endpoint asked
            cancelled = await gw.post(f"/v1/responses/{rid}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            assert f.asked("POST", f"/v1/responses/{rid}/cancel") == [maker]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_follow_up_runs_where_its_previous_response_is(stream: bool) -> None:
    async with fleet() as f:
        gw = await f.worker()
        for _ in range(3):
            first = await _create(gw)
            maker = f.holder(first)
            f.log.clear()
            body = {"model": MODEL, "input": "And again.", "previous_response_id": first, "stream": stream}
            r = await gw.post("/v1/responses", json=body)  # always-baseline would send it to baseline
            assert r.status_code == 200, r.text
            assert r.headers["x-specroute-pool"] == "speculative"
            assert r.headers["x-specroute-reason"] == "affinity"
            assert "x-specroute-predicted-speedup" not in r.headers
            assert f.asked("POST", "/v1/responses") == [maker.name]  # there first, and only there
            follow = f"resp_{maker.name}_{maker.made}"  # the follow-up's own response, made there too
            assert (await gw.get(f"/v1/responses/{follow}")).status_code == 200
            assert f.asked("GET", f"/v1/responses/{follow}") == [maker.name]
            # a pool the client names gives way: the previous response is on one endpoint only
            forced = await gw.post("/v1/responses", json=body, headers={"x-specroute-pool": "baseline"})
            assert forced.status_code == 200 and forced.headers["x-specroute-reason"] == "affinity"


async def test_a_response_made_by_another_worker_is_found_by_asking_each_endpoint() -> None:
    """Workers (or the gateway before a restart) share no notes: an id unknown here is looked for."""
    async with fleet() as f:
        made_by, other = await f.worker(), await f.worker()
        rid = await _create(made_by)
        maker = f.holder(rid).name
        got = await other.get(f"/v1/responses/{rid}")
        assert got.status_code == 200 and got.json()["id"] == rid
        asked = f.asked("GET", f"/v1/responses/{rid}")
        assert asked[-1] == maker and len(asked) == len(set(asked))  # each at most once, the maker last
        again = await other.get(f"/v1/responses/{rid}")  # found once: noted
        assert again.status_code == 200 and f.asked("GET", f"/v1/responses/{rid}")[len(asked) :] == [maker]
        body = {"model": MODEL, "input": "More.", "previous_response_id": await _create(made_by)}
        for stream in (False, True):
            r = await other.post("/v1/responses", json={**body, "stream": stream})
            assert r.status_code == 200, r.text
            assert r.headers["x-specroute-pool"] == "speculative"
        cancelled = await other.post(f"/v1/responses/{await _create(made_by)}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


async def test_an_endpoint_that_lost_the_response_sends_the_request_on() -> None:
    """The endpoint that made it answers 404 (restarted, its memory gone): the others are asked."""
    async with fleet() as f:
        gw = await f.worker()
        rid = await _create(gw)
        maker = f.holder(rid)
        f.base[1].store[rid] = maker.store.pop(rid)  # now only base1 holds it
        got = await gw.get(f"/v1/responses/{rid}")
        assert got.status_code == 200 and got.headers["x-specroute-pool"] == "baseline"
        assert f.asked("GET", f"/v1/responses/{rid}")[0] == maker.name
        body = {"model": MODEL, "input": "More.", "previous_response_id": rid}
        r = await gw.post("/v1/responses", json=body)
        assert r.status_code == 200 and f.asked("POST", "/v1/responses")[-1] == "base1"


async def test_an_id_no_endpoint_holds_is_vllms_404_after_asking_each_endpoint_once() -> None:
    async with fleet() as f:
        gw = await f.worker()
        message = "Response with id 'resp_gone' not found."
        got = await gw.get("/v1/responses/resp_gone")
        assert got.status_code == 404 and got.json()["error"]["message"] == message
        assert sorted(f.asked("GET", "/v1/responses/resp_gone")) == sorted(u.name for u in f.all)
        cancel = await gw.post("/v1/responses/resp_gone/cancel")
        assert cancel.status_code == 404 and cancel.json()["error"]["message"] == message
        assert len(f.asked("POST", "/v1/responses/resp_gone/cancel")) == len(f.all)
        for stream in (False, True):
            body = {"model": MODEL, "input": "More.", "previous_response_id": "resp_gone", "stream": stream}
            r = await gw.post("/v1/responses", json=body)
            assert r.status_code == 404 and r.json()["error"]["message"] == message
            assert r.headers["x-specroute-reason"] == "always-baseline"
        assert len(f.asked("POST", "/v1/responses")) == 2 * len(f.all)
