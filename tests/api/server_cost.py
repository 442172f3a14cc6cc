"""What the whole server executes per request: uvicorn, the event loop, the gateway and its upstream client.

    python -m tests.api.server_cost [--peer specroute|floor-asgi-wire|floor-raw] [--stream]
        [--requests 1000] [--warmup 300] [--port 18700] [--keep DIR]

The in-process driver (:mod:`tests.api.inprocess_profile`) hands requests straight to the ASGI
application; this one runs the real server (``python -m gateway serve``, uvicorn with uvloop and
httptools and the gateway's own protocol) under ``valgrind --tool=callgrind`` and sends it requests one
after the other over one keep-alive connection from this process, so that the count includes what the
in-process driver leaves out: reading and parsing the client's request, the scope, the response cycle
and its writes, the event loop's wake-ups. Counting is switched on (``callgrind_control -i on``) after
``--warmup`` requests and dumped after ``--requests`` more, so start-up is left out; the figure is the
event loop's thread's instructions divided by the requests (the access log's writer thread is counted
apart and printed too).

The gateway runs with the peer-bench harness's configuration (both pools at the stub) plus what makes
its work per request the same however slowly valgrind runs it: health checks and scrapes at start only,
``routing.strategy: always-baseline`` (the whole decision, the same way every time) and a fixed seed.
The floors are the forwarding-only proxies of :mod:`tests.upstream.floor_proxies`.

An upstream stub (``../shared/tools/peer_bench/upstream_stub.py``, the harness's Python) answers on
``--port``, the proxy listens on the next port. ``--keep DIR`` keeps callgrind's files there for
``callgrind_annotate --inclusive=yes``; ``--parts`` runs the gateway through
:mod:`tests.api.server_parts` and prints what each part of the path costs a request (the detours add a
few thousand instructions to the total). Not a test: a benchmark that prints figures. Run from the
repository root; about a minute per thousand requests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httptools

from tests.upstream.relay_cost import callgrind_totals, harness_settings

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT.parent / "shared" / "tools" / "peer_bench"
HOME = Path(os.environ.get("PEER_BENCH_HOME", "/tmp/peer-bench"))
HARNESS = HOME / "venv-harness" / "bin" / "python"
PROMPT = "Write one sentence about benchmarking proxies."


class Client:
    """One keep-alive connection; each request sent whole and its response read to the end."""

    def __init__(self, port: int, body: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Accept: */*\r\nContent-Length: %d\r\n\r\n%s" % (port, len(body), body)
        )
        self.done = False
        self.status = 0
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.done = True

    def one(self) -> int:
        self.done = False
        self.sock.sendall(self.request)
        while not self.done:
            data = self.sock.recv(65536)
            if not data:
                raise SystemExit("the proxy closed the connection")
            self.parser.feed_data(data)
        return int(self.parser.get_status_code())

    def close(self) -> None:
        self.sock.close()


def _wait_listening(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s:.0f} s")


def _command(peer: str, port: int, upstream: str, tmp: Path, parts: bool = False) -> list[str]:
    if peer.startswith("floor-"):
        return [
            sys.executable,
            "-m",
            "tests.upstream.floor_proxies",
            peer.removeprefix("floor-"),
            str(port),
            upstream,
        ]
    settings = {
        **harness_settings(port, upstream),
        "health": {"interval_s": 3600.0},
        "routing": {"scrape_interval_s": 3600.0, "strategy": "always-baseline", "seed": 1},
    }
    config = tmp / "specroute.yaml"
    config.write_text(json.dumps(settings))  # JSON is YAML
    server = "tests.api.server_parts" if parts else "gateway"
    return [sys.executable, "-m", server, "serve", "--config", str(config)]


def _parts(dump: Path, requests: int) -> list[str]:
    """Each part's inclusive count a request (see :mod:`tests.api.server_parts`), from the dump."""
    from tests.api.server_parts import PARTS

    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = []
    for name, what in PARTS:
        found = re.search(rf"^\s*([\d,]+) .*:{name} ", out, re.MULTILINE)
        count = int(found[1].replace(",", "")) / requests if found else float("nan")
        lines.append(f"{count / 1000:9.1f} k  {what}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", choices=["specroute", "floor-asgi-wire", "floor-raw"], default="specroute")
    parser.add_argument("--stream", action="store_true", help="streamed completions (the stub's 20 chunks)")
    parser.add_argument("--requests", type=int, default=1000, help="requests counted")
    parser.add_argument("--warmup", type=int, default=300, help="requests before counting starts")
    parser.add_argument("--port", type=int, default=18700, help="the stub's; the proxy's is the next one up")
    parser.add_argument("--keep", type=Path, help="a directory to keep callgrind's files in")
    parser.add_argument(
        "--parts", action="store_true", help="the gateway's parts too (tests.api.server_parts: a few k more)"
    )
    args = parser.parse_args()
    if not HARNESS.exists():
        raise SystemExit(f"no harness at {HARNESS}: run {BENCH / 'setup_harness.sh'} first")
    upstream = f"http://127.0.0.1:{args.port}"
    proxy_port = args.port + 1
    request: dict[str, object] = {"model": "stub-model", "prompt": PROMPT, "max_tokens": 16}
    if args.stream:
        request["stream"] = True
    body = json.dumps(request, separators=(",", ":")).encode()
    stub_cmd = [
        str(HARNESS),
        str(BENCH / "upstream_stub.py"),
        "--port",
        str(args.port),
        "--stream-chunks",
        "20",
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(stub_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with tempfile.TemporaryDirectory() as tmp:
            counts = Path(tmp) / "callgrind.out"
            proxy_cmd = _command(args.peer, proxy_port, upstream, Path(tmp), args.parts)
            cmd = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                f"--callgrind-out-file={counts}", *proxy_cmd,
            ]  # fmt: skip
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            proxy = subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            procs.append(proxy)
            _wait_listening(proxy_port, 300.0)
            client = Client(proxy_port, body)
            for _ in range(args.warmup):
                if (status := client.one()) != 200:
                    raise SystemExit(f"the proxy answered {status}")
            subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], check=True, capture_output=True)
            for _ in range(args.requests):
                client.one()
            for command in ("-i", "off"), ("-d",):
                subprocess.run(
                    ["callgrind_control", *command, str(proxy.pid)], check=True, capture_output=True
                )
            loop = callgrind_totals(Path(f"{counts}.1-01"), 120.0)  # the first dump's file of thread 1
            others = sum(
                callgrind_totals(p, 120.0)
                for p in Path(tmp).glob("callgrind.out.1-*")
                if not p.name.endswith("-01")
            )
            client.close()
            kind = "streamed" if args.stream else "non-streamed"
            print(
                f"{args.peer}, {args.requests} {kind} requests: {loop / args.requests:,.0f} instructions"
                f" of the event loop's thread a request ({others / args.requests:,.0f} in other threads)"
            )
            if args.parts and args.peer == "specroute":
                print("\n".join(_parts(Path(f"{counts}.1-01"), args.requests)))
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for p in Path(tmp).glob("callgrind.out*"):
                    shutil.copy(p, args.keep / p.name)
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
