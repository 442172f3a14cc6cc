"""The emulator's HTTP server: a bare ASGI application run by uvicorn (httptools, uvloop).

No web framework sits in the request path: routing is one dict lookup and bodies are orjson, so that in
zero-delay mode (``--time-scale 0``) the emulator costs next to nothing and a benchmark through the
gateway measures the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.emulator.acceptance import base_profile, effective_alpha, load_profile, profile
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.engine import Engine, Group, Seq, Source
from gateway.emulator.metrics import CONTENT_TYPE, EngineMetrics, make_registry, render
from gateway.emulator.pooling import detokenize_body, embeddings_body, tokenize_body
from gateway.emulator.protocol import (
    VLLM_VERSION,
    ApiError,
    GenRequest,
    Prompt,
    Responder,
    error_body,
    models_body,
    parse_json,
    parse_request,
)
from gateway.emulator.responses import ResponsesResponder, parse_responses_request
from gateway.emulator.structured import FixedSource
from gateway.emulator.textgen import TextSource, opening_categories, split_points
from gateway.types import RUN_TOKEN_ENV, RUN_TOKEN_HEADER

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"vary", b"Origin")]


class EmulatedReset(Exception):
    """Raised inside a response to make uvicorn drop the connection mid-body (fault injection)."""


class _DropResetLogs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, EmulatedReset)


async def _read_body(receive: Receive) -> bytes:
    msg = await receive()
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body"):
        return body
    parts = [body]
    while msg.get("more_body"):
        msg = await receive()
        parts.append(msg.get("body", b""))
    return b"".join(parts)


async def _send_bytes(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class EmulatorApp:
    def __init__(self, cfg: EmulatorConfig) -> None:
        self.cfg = cfg
        self.acceptance = load_profile(cfg.acceptance_profile)
        self.metrics = EngineMetrics(cfg.num_speculative_tokens, cfg.max_model_len, cfg.speculative)
        self.metrics.zero_spec_counters = cfg.spec_decode_counters == "zero"
        self.registry = make_registry(
            self.metrics, cfg.served_model_names[0], cfg.block_size, cfg.kv_cache_tokens
        )
        self.engine = Engine(cfg, self.metrics)
        self.fault_rng = random.Random(cfg.seed * 7919 + 17)
        self.id_rng = random.Random()
        digest = hashlib.blake2b(
            f"{cfg.mode}|{cfg.root}|{cfg.num_speculative_tokens}".encode(), digest_size=4
        )
        self.fingerprint = f"vllm-{VLLM_VERSION}-{digest.hexdigest()}"
        self.started = int(time.time())
        self.faults = {"errors": 0, "hangs": 0, "resets": 0, "slow_first_bytes": 0}
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/responses"): self._responses,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/version"): self._version,
            ("POST", "/emulator/control"): self._control,
            ("GET", "/emulator/state"): self._state,
        }
        self._paths = {p for _, p in self.routes}
        token = os.environ.get(RUN_TOKEN_ENV)
        self._run_header = [(RUN_TOKEN_HEADER.encode(), token.encode())] if token else []
        logging.getLogger("uvicorn.error").addFilter(_DropResetLogs())

    # -- ASGI entry --------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            handler = self.routes.get((scope["method"], scope["path"]))
            if handler is not None:
                await handler(scope, receive, send)
            elif scope["path"] in self._paths:
                await _send_bytes(send, 405, b'{"detail":"Method Not Allowed"}', JSON_HEADERS)
            else:
                await _send_bytes(send, 404, b'{"detail":"Not Found"}', JSON_HEADERS)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- small endpoints ---------------------------------------------------------------------
    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"0"), *self._run_header]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_bytes(send, 200, orjson.dumps({"version": VLLM_VERSION}), JSON_HEADERS)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = models_body(self.cfg, int(time.time()), f"modelperm-{self.id_rng.getrandbits(64):016x}")
        await _send_bytes(send, 200, body, JSON_HEADERS)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_bytes(send, 200, render(self.registry), [(b"content-type", CONTENT_TYPE.encode())])

    def state(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "mode": self.cfg.mode,
            "settings": self.cfg.as_dict(),
            "counters": {
                **self.engine.counters,
                **self.faults,
                "running": m.running,
                "waiting": m.waiting,
                "prompt_tokens": m.prompt_tokens,
                "generation_tokens": m.generation_tokens,
                "num_drafts": m.num_drafts,
                "num_draft_tokens": m.num_draft_tokens,
                "num_accepted_tokens": m.num_accepted,
                "finished_by_reason": dict(m.success),
            },
        }

    async def _state(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_bytes(send, 200, orjson.dumps(self.state()), JSON_HEADERS)

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data = parse_json(await _read_body(receive))
            self.cfg.apply(data)
        except ApiError as e:
            await _send_bytes(send, e.status, e.body, JSON_HEADERS)
            return
        except ValueError as e:
            await _send_bytes(send, 400, error_body(str(e), "BadRequestError", None, 400), JSON_HEADERS)
            return
        await _send_bytes(send, 200, orjson.dumps(self.state()), JSON_HEADERS)

    # -- generation --------------------------------------------------------------------------
    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(False, receive, send, named=_request_id(scope))

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(True, receive, send, named=_request_id(scope))

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(True, receive, send, responses=True)

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Embeddings cost one prefill of their tokens (no queue: pooling runs beside generation)."""
        try:
            rid = f"embd-{self.id_rng.getrandbits(64):016x}"
            body, tokens = embeddings_body(
                parse_json(await _read_body(receive)), self.cfg, rid, int(time.time())
            )
        except ApiError as e:
            await _send_bytes(send, e.status, e.body, JSON_HEADERS)
            return
        if self.cfg.time_scale > 0:
            await asyncio.sleep(self.engine.prefill_cost_ms(tokens) * self.cfg.time_scale / 1000.0)
        await _send_bytes(send, 200, body, JSON_HEADERS)

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(receive, send, tokenize_body)

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(receive, send, detokenize_body)

    async def _answer(
        self, receive: Receive, send: Send, make: Callable[[dict[str, Any], EmulatorConfig], bytes]
    ) -> None:
        try:
            body = make(parse_json(await _read_body(receive)), self.cfg)
        except ApiError as e:
            await _send_bytes(send, e.status, e.body, JSON_HEADERS)
            return
        await _send_bytes(send, 200, body, JSON_HEADERS)

    def _build(self, req: GenRequest, timed: bool) -> Group:
        cfg = self.cfg
        group = Group(req.stream, timed)
        nonce = b""
        if req.temperature > 0 and req.seed is None:
            nonce = self.id_rng.getrandbits(64).to_bytes(8, "little")
        head = f"{cfg.seed}|{req.temperature!r}|{req.seed}|".encode() + nonce
        for i, p in enumerate(req.prompts):
            self._add_seq(group, i, p, req, head)
        return group

    def _add_seq(self, group: Group, index: int, p: Prompt, req: GenRequest, head: bytes) -> Seq:
        cfg = self.cfg
        material = head + array("i", p.ids).tobytes()
        acc_seed = int.from_bytes(hashlib.blake2b(material + b"acc", digest_size=8).digest(), "little")
        source: Source | None
        if req.constraint is not None:
            rng = random.Random(int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little"))
            source, text = FixedSource(req.constraint.render(rng)), p.text
        else:
            source, text = _continued(p, req, head)
        if source is None:
            source, text = _source(p.text, p.ids, head), p.text
        base_alpha = base_profile(text, self.acceptance).alpha
        alpha = effective_alpha(base_alpha, req.temperature, cfg.acceptance_scale, req.emulated_acceptance)
        max_tokens = req.max_tokens if req.max_tokens is not None else cfg.max_model_len - len(p.ids)
        return Seq(
            group,
            index,
            p.ids,
            max_tokens,
            source,
            random.Random(acc_seed),
            alpha,
            req.stops,
            req.include_stop,
        )

    async def _generate(
        self, chat: bool, receive: Receive, send: Send, responses: bool = False, named: str | None = None
    ) -> None:
        """``named``: the request's ``X-Request-Id``, which names it as vLLM does (else the body's
        ``request_id``, else a random id)."""
        cfg = self.cfg
        try:
            data = parse_json(await _read_body(receive))
            req = parse_responses_request(data, cfg) if responses else parse_request(chat, data, cfg)
        except ApiError as e:
            await _send_bytes(send, e.status, e.body, JSON_HEADERS)
            return
        # -- injected faults --
        if cfg.slow_first_byte_ms > 0:
            self.faults["slow_first_bytes"] += 1
            await asyncio.sleep(cfg.slow_first_byte_ms / 1000.0)
        rnd = self.fault_rng.random
        if cfg.error_rate > 0 and rnd() < cfg.error_rate:
            self.faults["errors"] += 1
            body = error_body(
                "Emulated internal server error (injected fault).", "InternalServerError", None, 500
            )
            await _send_bytes(send, 500, body, JSON_HEADERS)
            return
        if cfg.hang_rate > 0 and rnd() < cfg.hang_rate:
            self.faults["hangs"] += 1
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        reset = cfg.reset_rate > 0 and rnd() < cfg.reset_rate

        responder: Responder | ResponsesResponder
        if responses:
            rid, item = (f"{p}_{self.id_rng.getrandbits(128):032x}" for p in ("resp", "msg"))
            responder = ResponsesResponder(req, rid, item, int(time.time()), data)
        else:
            if named is None:
                given = data.get("request_id")
                named = given if isinstance(given, str) else f"{self.id_rng.getrandbits(64):016x}"
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{named}"
            metrics_on = cfg.per_request_spec_decode_metrics == "summary" and cfg.speculative
            responder = Responder(
                req, rid, int(time.time()), self.fingerprint, cfg.num_speculative_tokens, metrics_on
            )
        if cfg.time_scale <= 0:
            group = self._build(req, timed=False)
            self.engine.run_inline(group)
            await self._respond_inline(group, responder, send, reset)
        else:
            group = self._build(req, timed=True)
            await self._respond_timed(group, responder, receive, send, reset)

    async def _reset(self, send: Send, partial: bytes, total: int | None) -> None:
        self.faults["resets"] += 1
        if total is not None:  # a plain response: promise the whole body, deliver part of it
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*JSON_HEADERS, (b"content-length", str(total).encode())],
                }
            )
        await send({"type": "http.response.body", "body": partial, "more_body": True})
        raise EmulatedReset

    async def _respond_inline(
        self, group: Group, responder: Responder | ResponsesResponder, send: Send, reset: bool
    ) -> None:
        if not group.stream:
            body = responder.full(group.seqs)
            if reset:
                await self._reset(send, body[: len(body) // 2], len(body))
            await _send_bytes(send, 200, body, JSON_HEADERS)
            return
        events = group.events
        no_usage = not responder.req.include_usage
        parts = [
            responder.chunk(seq, start, end, delta, fin, no_usage and fin)
            for seq, start, end, delta, fin in events
        ]
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if reset:
            await self._reset(send, b"".join(parts[: max(1, len(parts) // 2)]), None)
        parts.append(responder.tail(group.seqs))
        await send({"type": "http.response.body", "body": b"".join(parts)})

    async def _respond_timed(
        self,
        group: Group,
        responder: Responder | ResponsesResponder,
        receive: Receive,
        send: Send,
        reset: bool,
    ) -> None:
        engine = self.engine
        wake = group.wake
        assert wake is not None
        engine.submit(group)

        def _on_disconnect(fut: asyncio.Future[Any]) -> None:
            if not fut.cancelled() and not group.done:
                engine.abort(group)

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(_on_disconnect)
        try:
            if not group.stream:
                while not group.done:
                    await wake.wait()
                    wake.clear()
                    if group.aborted:
                        return
                body = responder.full(group.seqs)
                if reset:
                    await self._reset(send, body[: len(body) // 2], len(body))
                await _send_bytes(send, 200, body, JSON_HEADERS)
                return
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            no_usage = not responder.req.include_usage
            total = sum(s.max_tokens for s in group.seqs)
            reset_at = self.fault_rng.randint(1, max(1, total // 2)) if reset else -1
            sent = 0
            while True:
                await wake.wait()
                wake.clear()
                if group.aborted:
                    return
                events = group.take()
                done = group.done
                parts = []
                for seq, start, end, delta, fin in events:
                    parts.append(responder.chunk(seq, start, end, delta, fin, no_usage and fin))
                    sent += end - start
                if reset and sent >= reset_at and not done:
                    engine.abort(group)
                    await self._reset(send, b"".join(parts), None)
                if done:
                    parts.append(responder.tail(group.seqs))
                    await send({"type": "http.response.body", "body": b"".join(parts)})
                    return
                if parts:
                    await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
        finally:
            watcher.cancel()
            if not group.done:
                engine.abort(group)


# How many of a completion prompt's last tokens may be the emulator's own answer being continued.
CONTINUATION_WINDOW = 256


def _source(text: str, ids: tuple[int, ...], head: bytes, category: str | None = None) -> TextSource:
    material = head + array("i", ids).tobytes()
    seed = int.from_bytes(hashlib.blake2b(material + b"text", digest_size=8).digest(), "little")
    return TextSource(text, category or profile(text).category, random.Random(seed))


def _continued(p: Prompt, req: GenRequest, head: bytes) -> tuple[TextSource | None, str]:
    """The source of a context that is a prompt plus the start of the emulator's own answer to it,
    positioned after that start, and the prompt text; ``(None, "")`` for any other context.

    A chat says where its open assistant message begins. A completion prompt does not, so its last
    :data:`CONTINUATION_WINDOW` token boundaries are tried, earliest first (the longest answer wins);
    only at temperature 0, where an answer is a function of its prompt alone. A mismatch shows at
    the first differing token, and only the categories whose answers can open with that text are
    tried (:func:`opening_categories`), so a boundary usually costs a segment or two; the prompt's
    rules are checked only for a match.
    """
    if p.origin is not None:
        source = _source(p.origin.text, p.origin.ids, head)
        return (source, p.origin.text) if source.skip(p.said) else (None, "")
    if req.chat or not p.text or req.temperature != 0:
        return None, ""
    rules = profile.__wrapped__  # not the cached one: these prefixes are seen once
    for n, prompt, said in split_points(p.text, CONTINUATION_WINDOW):
        # the prompt's ids are a prefix of the context's: BOS, then its first n tokens
        for category in opening_categories(prompt, said):
            source = _source(prompt, p.ids[: n + 1], head, category)
            if source.skip(said) and rules(prompt).category == category:
                return source, prompt
    return None, ""


def run(cfg: EmulatorConfig, host: str, port: int) -> None:
    import uvicorn

    app = EmulatorApp(cfg)
    kwargs: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401

        kwargs["loop"] = "uvloop"
    with contextlib.suppress(ImportError):
        import httptools  # noqa: F401

        kwargs["http"] = "httptools"
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
        **kwargs,
    )


def _request_id(scope: Scope) -> str | None:
    """The request's ``X-Request-Id`` header, as vLLM reads it (``_base_request_id``)."""
    for key, value in scope["headers"]:
        if key == b"x-request-id":
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None
