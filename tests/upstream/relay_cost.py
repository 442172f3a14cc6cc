"""What relaying a stream costs a proxy per chunk, when the chunks come apart as a model server sends them.

    python -m tests.upstream.relay_cost [--peer specroute|vllm-router|floor-raw|floor-asgi-wire]
        [--rate 20] [--duration 10] [--instructions]

An upstream stub (``../shared/tools/peer_bench/upstream_stub.py``) streams ``--chunks`` SSE chunks per
completion, ``--gap-ms`` apart (200 chunks 5 ms apart: a second-long answer, one chunk per engine step);
the peer-bench load generator opens ``--rate`` such streams a second through the proxy for ``--duration``
seconds (about ``rate * chunks * gap`` streams at once), and the proxy's CPU time over the run (user +
system, from ``/proc``) is divided by the chunks it relayed. The proxies are started by the peer-bench
scripts (``run_specroute.sh`` installs this checkout), on loopback ports, and stopped at the end; the
two floors are the forwarding-only proxies of :mod:`tests.upstream.floor_proxies` (``raw`` and
``asgi-wire``), run from this checkout.

The peer-bench harness (``setup_harness.sh``) must have been set up; run from the repository root.
A streamed request's per-request work (validation, routing, observation) is in the figure too, spread
over its chunks. Not a test: a benchmark that prints figures.

CPU time per chunk moves by a tenth between runs on a shared machine. ``--instructions`` counts instead
what the proxy's event loop executes per chunk relayed: this checkout's gateway or floor (this Python,
from the repository root) runs under ``valgrind --tool=callgrind``, counting only while the measured
streams run (the gateway: about 80,000 instructions a chunk, the same to within 0.5 % from run to
run). Valgrind slows a proxy some fifty times: give it one stream a second,
``--instructions --rate 1 --duration 10``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gateway.bench.overhead import Usage

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT.parent / "shared" / "tools" / "peer_bench"
HOME = Path(os.environ.get("PEER_BENCH_HOME", "/tmp/peer-bench"))
HARNESS = HOME / "venv-harness" / "bin" / "python"


def _listener(port: int, timeout_s: float = 60.0) -> int:
    """The pid of the process listening on 127.0.0.1:``port`` (the proxy, not its launcher)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s:.0f} s")


def _loadgen(url: str, rate: float, duration: float, out: Path) -> dict[str, object]:
    cmd = [str(HARNESS), str(BENCH / "loadgen.py"), "open", "--url", url, "--stream", "--rate", str(rate)]
    cmd += ["--duration", str(duration), "--warmup", "0", "--timeout", "60", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    result: dict[str, object] = json.loads(out.read_text())["target"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peer", choices=["specroute", "vllm-router", "floor-raw", "floor-asgi-wire"], default="specroute"
    )
    parser.add_argument("--rate", type=float, default=20.0, help="streams opened a second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--chunks", type=int, default=200, help="chunks a stream")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="time between a stream's chunks")
    parser.add_argument("--port", type=int, default=18400, help="the stub's; the proxy's is the next one up")
    parser.add_argument(
        "--instructions", action="store_true", help="count the proxy's instructions a chunk (callgrind)"
    )
    args = parser.parse_args()
    if args.instructions and args.peer == "vllm-router":
        parser.error("--instructions counts this checkout's proxies only (not --peer vllm-router)")
    if not HARNESS.exists():
        raise SystemExit(f"no harness at {HARNESS}: run {BENCH / 'setup_harness.sh'} first")
    stub_port, proxy_port = args.port, args.port + 2  # the router's metrics take the port after its own
    upstream = f"http://127.0.0.1:{stub_port}"
    procs: list[subprocess.Popen[bytes]] = []
    pid = 0
    try:
        stub = [str(HARNESS), str(BENCH / "upstream_stub.py"), "--port", str(stub_port)]
        stub += ["--stream-chunks", str(args.chunks), "--chunk-delay-ms", str(args.gap_ms)]
        procs.append(subprocess.Popen(stub, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        env = {**os.environ, "SPECROUTE_SRC": str(ROOT)}
        url = f"http://127.0.0.1:{proxy_port}"
        with tempfile.TemporaryDirectory() as tmp:
            counts = Path(tmp) / "callgrind.out"
            cmd = _command(args.peer, proxy_port, upstream, Path(tmp), args.instructions)
            if args.instructions:
                cmd = [
                    "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                    f"--callgrind-out-file={counts}", *cmd,
                ]  # fmt: skip
            procs.append(
                subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            pid = _listener(proxy_port, 300.0 if args.instructions else 60.0)
            _loadgen(url, args.rate, 2.0, Path(tmp) / "warm.json")
            if args.instructions:
                subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
            usage = Usage(psutil.Process(pid))  # its workers' CPU too, with server.workers
            usage.start()
            target = _loadgen(url, args.rate, args.duration, Path(tmp) / "run.json")
            used_s = usage.cpu_seconds()
            if args.instructions:
                # the counts as they stand (a floor proxy idle in its event loop would not see a SIGINT)
                for command in ("-i", "off"), ("-d",):
                    subprocess.run(["callgrind_control", *command, str(pid)], check=True, capture_output=True)
                executed = _event_loop_instructions(counts)
        streams = int(str(target["ok"]))
        if not streams or target["errors"]:
            raise SystemExit(f"{streams} streams, {target['errors']} errors: {target.get('error_kinds')}")
        if args.instructions:
            per_chunk = executed / (streams * args.chunks)
            print(
                f"{args.peer} under callgrind: {streams} streams of {args.chunks} chunks {args.gap_ms:g} ms "
                f"apart: {per_chunk:,.0f} instructions of the event loop a chunk"
            )
            return
        ttft = target["ttft_ms"]
        assert isinstance(ttft, dict)
        print(
            f"{args.peer}: {streams} streams of {args.chunks} chunks {args.gap_ms:g} ms apart, "
            f"{args.rate:g}/s: {used_s * 1e6 / (streams * args.chunks):.1f} µs of CPU a chunk "
            f"({used_s * 1e3 / streams:.2f} ms a stream); time to first byte p50 {ttft['p50']:.2f} ms"
        )
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # the proxy itself, wherever its launcher started it
        for proc in reversed(procs):
            proc.terminate()  # under valgrind the proxy's pid is its own: the SIGTERM above ends it
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _command(peer: str, port: int, upstream: str, tmp: Path, here: bool) -> list[str]:
    """How to start ``peer`` on ``port`` in front of ``upstream``; the gateway in this Python when ``here``
    (as ``run_specroute.sh`` configures it, which installs the checkout in the harness's own environment)."""
    if peer == "vllm-router":
        return ["bash", str(BENCH / "run_vllm_router.sh"), str(port), upstream, "--policy", "round_robin"]
    if peer.startswith("floor-"):
        mode = peer.removeprefix("floor-")
        return [sys.executable, "-m", "tests.upstream.floor_proxies", mode, str(port), upstream]
    if not here:
        return ["bash", str(BENCH / "run_specroute.sh"), str(port), upstream]
    config = tmp / "specroute.yaml"
    config.write_text(json.dumps(harness_settings(port, upstream)))  # JSON is YAML
    return [sys.executable, "-m", "gateway", "serve", "--config", str(config)]


def harness_settings(port: int, upstream: str) -> dict[str, Any]:
    """The gateway's configuration as ``run_specroute.sh`` writes it: both pools at ``upstream``."""
    pools: dict[str, dict[str, Any]] = {
        name: {"endpoints": [{"name": f"{name[:4]}-0", "url": upstream}], "models": ["stub-model"]}
        for name in ("speculative", "baseline")
    }
    pools["speculative"]["num_speculative_tokens"] = 7
    return {
        "server": {"host": "127.0.0.1", "port": port, "workers": 1},
        "pools": pools,
        "logging": {"level": "warning"},
    }


def _event_loop_instructions(counts: Path) -> int:
    """Instructions of the main thread (the event loop), from the first dump's file for thread 1."""
    return callgrind_totals(Path(f"{counts}.1-01"), 60.0)


def callgrind_totals(dump: Path, timeout_s: float) -> int:
    """The ``totals:`` line of a callgrind dump, waited for up to ``timeout_s`` (callgrind writes the
    dump when the process next runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dump.exists():
            for line in dump.read_text().splitlines():
                if line.startswith("totals:"):
                    return int(line.split()[1])
        time.sleep(0.5)
    raise SystemExit(f"no totals in {dump}")


if __name__ == "__main__":
    main()
