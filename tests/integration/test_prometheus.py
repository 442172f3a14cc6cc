"""A real Prometheus scraping a demo stack: every dashboard query and recording rule returns data.

Stack: one speculative and one baseline emulator (time-scaled) behind a two-worker gateway, scraped
every second by Debian's ``prometheus`` with the shipped ``deploy/prometheus/prometheus.yml`` — Pod
discovery swapped for file discovery carrying the same Kubernetes meta labels, so the shipped
relabelling is what names the ``pool`` and ``endpoint`` of each vLLM series. After a bounded mix of
requests (structured and open-ended, streamed and not, completions and chat, some forced to each pool
so both pools are measured for every class), every panel query of the Grafana dashboard (variables
substituted) and every recording rule is evaluated through ``/api/v1/query``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from gateway import stack
from gateway.observability import MULTIPROC_ENV
from gateway.observe import ACCESS_FIELDS
from gateway.upstream.discovery import discovered_name
from tests.observability.tooling import (
    PROMETHEUS_DIR,
    binary,
    dashboard,
    dashboard_queries,
    recording_rules,
    substitute,
)

MODEL = "demo-model"
SCALE = "0.2"
STRUCTURED = "Repeat the following line exactly 30 times: the quick brown fox jumps over the lazy dog"
OPEN_ENDED = "Write a short story about a lighthouse keeper who finds a message in a bottle."
ROUNDS = 2
SETTLE_S = 30.0  # how long queries may take to show data once the traffic is scraped


@dataclass
class Sent:
    """What the traffic loop sent and got back."""

    ids: dict[str, str] = field(default_factory=dict)  # request id -> pool that answered (or "none")
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class Stack:
    workdir: Path
    gateway: stack.Process
    spec: stack.Process
    base: stack.Process


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return binary("prometheus")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prometheus")


@pytest.fixture(scope="module")
def demo(workdir: Path) -> Iterator[Stack]:
    extra = ["--served-model-name", MODEL, "--time-scale", SCALE, "--max-num-seqs", "16"]
    spec = stack.start_emulator("speculative", extra=extra, log_dir=workdir)
    with stack.running(spec):
        base = stack.start_emulator("baseline", extra=extra, log_dir=workdir)
        with stack.running(base):
            config = stack.demo_config(
                [spec.url],
                [base.url],
                stack.free_port(),
                MODEL,
                "adaptive",
                extra={
                    "server": {"workers": 2},
                    # a wide margin keeps the prose baseline-bound, so exploration (whose panel is checked)
                    # happens: with the default one the emulated prose may already gain on speculation
                    "routing": {"scrape_interval_s": 0.5, "exploration_rate": 0.5, "seed": 7, "margin": 0.5},
                },
            )
            gateway = stack.start_gateway(config, workdir)
            with stack.running(gateway):
                yield Stack(workdir, gateway, spec, base)


def _k8s_targets(demo: Stack) -> dict[str, list[dict[str, Any]]]:
    """File-discovery targets with the meta labels Kubernetes Pod discovery would attach."""

    def pod(url: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
        meta = {f"__meta_kubernetes_pod_label_{k}": v for k, v in labels.items()}
        meta |= {
            "__meta_kubernetes_pod_container_port_name": "http",
            "__meta_kubernetes_namespace": "specroute",
            "__meta_kubernetes_pod_name": name,
        }
        return {"targets": [url.removeprefix("http://")], "labels": meta}

    gateway = {"app_kubernetes_io_name": "specroute", "app_kubernetes_io_component": "gateway"}
    return {
        "specroute": [pod(demo.gateway.url, "specroute-0", gateway)],
        "vllm": [
            pod(demo.spec.url, "vllm-speculative-0", {"specroute_io_pool": "speculative"}),
            pod(demo.base.url, "vllm-baseline-0", {"specroute_io_pool": "baseline"}),
            # another workload in the namespace: relabelling must drop it
            pod(demo.base.url.replace("127.0.0.1", "localhost"), "unrelated-0", {"app": "other"}),
        ],
    }


def _prometheus_config(demo: Stack) -> Path:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROMETHEUS_DIR / f) for f in config["rule_files"]]
    targets = _k8s_targets(demo)
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        path = demo.workdir / f"{job['job_name']}-targets.json"
        path.write_text(json.dumps(targets[job["job_name"]]))
        job["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "1s"}]
    path = demo.workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(prometheus_bin: str, demo: Stack) -> Iterator[str]:
    """Our own Prometheus on a free loopback port with a throw-away data directory."""
    port = stack.free_port()
    data = Path(tempfile.mkdtemp(prefix="specroute-prometheus-"))
    log = open(demo.workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={_prometheus_config(demo)}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        stack.wait_healthy(url + "/-/ready", proc, timeout=30)
        _wait_targets_up(url, 3)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def _wait_targets_up(url: str, count: int, timeout: float = 30.0) -> None:
    """Discovered targets reach the scrape loop on a 5 s tick: wait until each was scraped once."""
    deadline = time.monotonic() + timeout
    while True:
        active = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        if len(active) >= count and all(t["health"] == "up" for t in active):
            return
        assert time.monotonic() < deadline, f"targets not up: {active}"
        time.sleep(0.5)


def _request(
    url: str, prompt: str, api: str, stream: bool, force: str | None, request_id: str
) -> httpx.Response:
    headers = {"x-request-id": request_id} | ({"x-specroute-pool": force} if force else {})
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "temperature": 0, "stream": stream}
    if api == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    # A new connection per request, so both gateway workers get a share of the traffic.
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=60) as r:
        r.read()
    return r


@pytest.fixture(scope="module")
def traffic(demo: Stack, prometheus: str) -> Sent:
    """The bounded request mix, sent while Prometheus scrapes; returns once the last count is scraped."""
    jobs = []
    for rnd in range(ROUNDS):
        for cls, prompt in (("s", STRUCTURED), ("o", OPEN_ENDED)):
            for stream in (True, False):
                for force in (None, "speculative", "baseline"):
                    for api in ("completions", "chat"):
                        rid = f"t{rnd}-{cls}-{int(stream)}-{force or 'auto'}-{api}"
                        jobs.append((prompt, api, stream, force, rid))
    sent = Sent()
    with ThreadPoolExecutor(6) as pool:
        futures = {rid: pool.submit(_request, demo.gateway.url, p, a, s, f, rid) for p, a, s, f, rid in jobs}
        for rid, fut in futures.items():
            r = fut.result()
            sent.ids[rid], sent.statuses[rid] = r.headers.get("x-specroute-pool", "none"), r.status_code
    for i in range(2):  # client errors are traffic too
        rid = f"bad-{i}"
        r = httpx.post(
            demo.gateway.url + "/v1/completions",
            json={"model": "no-such-model", "prompt": "x"},
            headers={"x-request-id": rid},
            timeout=10,
        )
        sent.ids[rid], sent.statuses[rid] = "none", r.status_code
    assert [s for s in sent.statuses.values() if s != 200] == [404, 404]
    deadline = time.monotonic() + SETTLE_S
    while _value(prometheus, "sum(specroute_requests_total)") != len(sent.ids):
        assert time.monotonic() < deadline, "Prometheus never scraped the final request count"
        time.sleep(0.5)
    return sent


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    assert body["data"]["resultType"] == "vector", expr
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _value(prometheus: str, expr: str) -> float | None:
    result = _query(prometheus, expr)
    return float(result[0]["value"][1]) if result else None


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


QUERIES = dict(dashboard_queries()) | {f"rule {r}": e for r, e in recording_rules()}
QUERIES |= {f"recorded {r}": r for r, _ in recording_rules()}


@pytest.fixture(scope="module")
def evaluated(prometheus: str, traffic: Sent) -> dict[str, list[dict[str, Any]]]:
    """Every query, retried until it has data or ``SETTLE_S`` has passed (rules need a few evaluations)."""
    results: dict[str, list[dict[str, Any]]] = {}
    pending = dict(QUERIES)
    deadline = time.monotonic() + SETTLE_S
    while pending:
        for name, expr in list(pending.items()):
            results[name] = _query(prometheus, expr)
            if _has_data(results[name]):
                del pending[name]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    empty = "\n".join(f"  {n}: {pending[n]}" for n in pending)
    print(
        f"\n{len(QUERIES) - len(pending)}/{len(QUERIES)} queries returned data"
        + (f"; empty:\n{empty}" * bool(empty))
    )
    return results


def test_targets_discovered_and_up(prometheus: str, traffic: Sent) -> None:
    active = httpx.get(prometheus + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert sorted((t["labels"]["job"], t["labels"].get("pool", "")) for t in active) == [
        ("specroute", ""),
        ("vllm", "baseline"),
        ("vllm", "speculative"),
    ]
    assert all(t["health"] == "up" for t in active), [
        (t["scrapeUrl"], t["health"], t.get("lastError")) for t in active
    ]
    for t in active:
        if t["labels"]["job"] == "vllm":  # named as the gateway names an endpoint it finds at that address
            host, port = t["labels"]["instance"].rsplit(":", 1)
            assert t["labels"]["endpoint"] == discovered_name(t["labels"]["pool"], host, int(port))


def test_rules_loaded_without_errors(prometheus: str, evaluated: dict[str, Any]) -> None:
    groups = httpx.get(prometheus + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules if r["type"] == "recording"} == {r for r, _ in recording_rules()}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    alerts = [r for r in rules if r["type"] == "alerting"]
    # The traffic forces open-ended prompts onto the speculative pool, where the emulator makes them about
    # as fast as on baseline: their realised speedup may dip under the alert's 0.9 on a busy machine, and
    # the alert then rightly goes pending. Every other alert has nothing to see in a healthy stack.
    judged = [r for r in alerts if r["name"] != "SpecRouteSpeculativeSlowerThanBaseline"]
    active = [(r["name"], r["state"], [a.get("labels") for a in r.get("alerts", [])]) for r in judged]
    assert len(judged) == len(alerts) - 1 and all(r["state"] == "inactive" for r in judged), [
        a for a in active if a[1] != "inactive"
    ]


@pytest.mark.parametrize("name", list(QUERIES))
def test_query_returns_data(evaluated: dict[str, list[dict[str, Any]]], name: str) -> None:
    assert _has_data(evaluated[name]), f"no data for {QUERIES[name]}"


def test_dashboard_variables_have_values(prometheus: str, traffic: Sent) -> None:
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = substitute(var["definition"]).removeprefix("label_values(").rstrip(")").split(", ")
        r = httpx.get(f"{prometheus}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10)
        values = set(r.json()["data"])
        assert values >= ({"speculative", "baseline"} if label == "pool" else {"structured", "open-ended"})


def _multiproc_dir(gateway: stack.Process) -> Path:
    for child in psutil.Process(gateway.popen.pid).children(recursive=True):
        found = child.environ().get(MULTIPROC_ENV)
        if found:
            return Path(found)
    raise AssertionError(f"no gateway worker has {MULTIPROC_ENV} set")


def _requests_total(families: Any) -> float:
    return sum(s.value for f in families for s in f.samples if s.name == "specroute_requests_total")


def test_worker_counts_add_up(demo: Stack, prometheus: str, traffic: Sent) -> None:
    """Both workers served requests, and one scrape of ``/metrics`` counts them all."""
    shared = _multiproc_dir(demo.gateway)
    per_worker = []
    for db in sorted(shared.glob("counter_*.db")):
        with tempfile.TemporaryDirectory() as alone:
            shutil.copy(db, alone)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, alone)
            per_worker.append(_requests_total(registry.collect()))
    assert len([n for n in per_worker if n > 0]) >= 2, per_worker
    scraped = _requests_total(text_string_to_metric_families(httpx.get(demo.gateway.url + "/metrics").text))
    assert scraped == sum(per_worker) == len(traffic.ids)
    assert _value(prometheus, "sum(specroute_requests_total)") == len(traffic.ids)


REQUIRED_LOG_FIELDS = set(ACCESS_FIELDS)  # every field of the access log


def test_access_log_lines(demo: Stack, traffic: Sent) -> None:
    log = demo.gateway.log()
    lines = [orjson.loads(line) for line in log.splitlines() if line.startswith("{")]
    by_id = {rec["request_id"]: rec for rec in lines if rec.get("request_id") in traffic.ids}
    assert set(by_id) == set(traffic.ids)
    assert len(lines) == len(traffic.ids)  # one line per request
    for rid, rec in by_id.items():
        assert set(rec) >= REQUIRED_LOG_FIELDS, f"missing {REQUIRED_LOG_FIELDS - set(rec)}"
        assert rec["status"] == traffic.statuses[rid] and rec["pool"] == traffic.ids[rid]
        if rec["status"] == 200:
            assert rec["endpoint"] in {"spec-0", "base-0"} and rec["class"] in {"structured", "open-ended"}
    assert STRUCTURED not in log and OPEN_ENDED not in log  # logging.log_prompts is off


def test_metrics_dir_removed_on_stop(demo: Stack) -> None:
    config = stack.demo_config(
        [demo.spec.url],
        [demo.base.url],
        stack.free_port(),
        MODEL,
        "classifier",
        extra={"server": {"workers": 2}},
    )
    gateway = stack.start_gateway(config, demo.workdir, name="gateway-short")
    try:
        shared = _multiproc_dir(gateway)
        assert shared.is_dir() and shared != _multiproc_dir(demo.gateway)
        assert httpx.get(gateway.url + "/metrics", timeout=10).status_code == 200
    finally:
        assert gateway.stop() == 0
    assert not shared.exists()
    assert os.environ.get(MULTIPROC_ENV) is None  # the test process itself stays single-process
