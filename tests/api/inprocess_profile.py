"""What the gateway's own work costs per request, driven in-process: no client socket, no load generator.

Completions go straight into the ASGI application (as uvicorn would hand them over, with the connection's
:class:`~gateway.types.ClientState`) one after the other, forwarded to a real upstream on loopback (the
peer-bench stub, an emulator, vLLM). What this process spends per request is the gateway's work plus the
upstream client's, without the server's parsing of the client's request.

    python -m tests.api.inprocess_profile --upstream http://127.0.0.1:18000 --model stub-model >/dev/null
    python -m tests.api.inprocess_profile ... --without classifier     # what one part costs: take it out
    python -m tests.api.inprocess_profile ... --profile cumtime         # cProfile (inflates small calls)
    python -m tests.api.inprocess_profile ... --stream                  # streamed completions instead
    python -m tests.api.inprocess_profile ... --seed 1                  # the same decisions every run
    python -m tests.api.inprocess_profile ... --calm                    # health checks, scrapes at start only

``--calm`` leaves out the work that comes with time rather than requests (health checks every 0.5 s,
upstream scrapes): under a tool that slows the process down (``valgrind --tool=callgrind``), a run
then does the same work per request however long it takes, and instruction counts compare. Under the
default strategy some decisions still follow time (the speedup model learns from measured timings, and
non-streamed requests to the speculative pool are measured at an interval): ``--strategy
always-baseline`` keeps the whole decision (classifier, acceptance model, loads) but sends every request
the same way, for counts that do not move with the machine's pace.

``--without`` replaces a part with a constant (the classifier's prediction, the acceptance model's
features, the observation after the response, or its metrics); the difference to a run with everything is
what that part costs inside the gateway, cold caches included, which a warm loop of the part alone does
not show.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
from typing import Any

import orjson
import uvloop

from classifiers.model import Classifier, Prediction
from gateway.app import create_app, fast_path
from gateway.config import load_settings
from gateway.routing import adaptive
from gateway.stack import demo_config
from gateway.types import CLIENT_SCOPE_KEY, ClientState


def _without(part: str) -> None:
    if part == "classifier":
        constant = Prediction(0.12, "open-ended", "qa")
        Classifier.predict = lambda self, body: constant  # type: ignore[method-assign,assignment]
    elif part == "accept-features":
        real, seen = adaptive.extract, {}

        def once_per_kind(body: Any, kind: str, p: float) -> Any:
            if kind not in seen:
                seen[kind] = real(body, kind, p)
            return seen[kind]

        adaptive.extract = once_per_kind  # type: ignore[assignment]
    elif part == "observe":
        from gateway.observe import Observer

        Observer.observe = lambda self, rec: None  # type: ignore[method-assign]
    elif part == "metrics":
        from gateway.observe import Observer

        Observer._count = lambda self, rec: None  # type: ignore[method-assign]
        Observer.decided = lambda self, decision, strategy: None  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown part {part!r}")


async def _drive(args: argparse.Namespace) -> None:
    extra: dict[str, Any] = {"routing": {}}
    if args.seed is not None:
        extra["routing"]["seed"] = args.seed
    if args.strategy is not None:
        extra["routing"]["strategy"] = args.strategy
    if args.calm:
        extra["routing"]["scrape_interval_s"] = 3600.0
        extra["health"] = {"interval_s": 3600.0}
    config = demo_config([args.upstream], [args.upstream], 8000, model=args.model, extra=extra)
    app = create_app(load_settings(overrides=config))
    asgi = fast_path(app)
    request: dict[str, Any] = {"model": args.model, "prompt": args.prompt, "max_tokens": 16}
    if args.stream:
        request["stream"] = True
    body = orjson.dumps(request)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def one() -> None:
        client = ClientState()
        client.body_complete = True
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "headers": headers,
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
            "root_path": "",
            CLIENT_SCOPE_KEY: client,
        }
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        statuses: list[int] = []
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await never
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await asgi(scope, receive, send)  # type: ignore[arg-type]
        if statuses != [200]:
            raise SystemExit(f"the gateway answered {statuses}: is the upstream at {args.upstream} serving?")

    async with app.router.lifespan_context(app):
        for _ in range(args.warmup):
            await one()
        profiler = cProfile.Profile() if args.profile else None
        started, times = time.process_time(), os.times()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.requests):
            await one()
        if profiler is not None:
            profiler.disable()
        spent, after = time.process_time() - started, os.times()
    # the access log has stdout: the figures go to stderr
    user, system = ((after[i] - times[i]) / args.requests * 1e6 for i in (0, 1))
    print(
        f"{spent / args.requests * 1e6:.1f} µs of CPU per request ({args.requests} requests;"
        f" user {user:.0f}, system {system:.0f})",
        file=sys.stderr,
    )
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(args.profile).print_stats(40)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", required=True, help="an OpenAI-compatible upstream on loopback")
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--prompt", default="Write one sentence about benchmarking proxies.")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--stream", action="store_true", help="streamed completions (the stub's chunks)")
    parser.add_argument("--seed", type=int, help="seed exploration: the same decisions in every run")
    parser.add_argument("--calm", action="store_true", help="health checks and scrapes at start only")
    parser.add_argument(
        "--strategy",
        help="routing.strategy (default adaptive); always-baseline decides as fully but the same way"
        " however fast the run goes, so instruction counts of two checkouts compare",
    )
    parser.add_argument("--without", action="append", default=[], help="a part to take out (repeatable)")
    parser.add_argument("--profile", choices=("cumtime", "tottime"), help="print a cProfile, sorted so")
    args = parser.parse_args(argv)
    for part in args.without:
        _without(part)
    uvloop.run(_drive(args))


if __name__ == "__main__":
    main()
