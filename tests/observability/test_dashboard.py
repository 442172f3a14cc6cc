"""The Grafana dashboard and its provisioning, checked without Grafana.

Every query must parse (promtool), use only series that exist — the gateway's, vLLM's (from the real
captures), or a recording rule — and pick its data source through the ``datasource`` variable.
"""

from __future__ import annotations

import re
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gateway.observability import Metrics
from tests.observability.tooling import (
    DASHBOARD,
    GRAFANA_DIR,
    ROOT,
    binary,
    dashboard,
    dashboard_queries,
    panels,
    recording_rules,
    substitute,
)

FIXTURES = ROOT / "tests" / "fixtures" / "vllm"
#: vLLM before 0.12 named the KV gauge differently; queries accept both.
VLLM_ALIASES = {"vllm:gpu_cache_usage_perc"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def gateway_series() -> set[str]:
    out: set[str] = set()
    for family in Metrics(CollectorRegistry()).registry.collect():
        out |= {family.name + s for s in SUFFIXES[family.type]}
    return out


def vllm_series() -> set[str]:
    out: set[str] = set()
    for path in FIXTURES.glob("*metrics*.txt"):
        for m in re.finditer(r"^# TYPE (\S+) (\w+)$", path.read_text(), re.M):
            name, kind = m.groups()
            if kind == "counter":  # vLLM's TYPE lines name counters with their suffix
                name = name.removesuffix("_total")
            out |= {name + s for s in SUFFIXES.get(kind, ("",))}
    return out


def series_in(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords and label names dropped)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = GROUPING.sub("", expr)
    names = {
        m.group(1)
        for m in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)\s*(\(?)", expr)
        if not m.group(2)  # a function call
    }
    return {n for n in names if n.lower() not in KEYWORDS}


def test_series_extraction() -> None:
    expr = 'sum by (pool, le) (rate(a_bucket{pool=~"$pool"}[1m])) / on (x) b:c:d or vector(0)'
    assert series_in(expr) == {"a_bucket", "b:c:d"}


def test_every_query_uses_known_series() -> None:
    known = gateway_series() | vllm_series() | VLLM_ALIASES | {r for r, _ in recording_rules()} | {"up"}
    exprs = [e for _, e in dashboard_queries()] + [e for _, e in recording_rules()]
    unknown = {n for e in exprs for n in series_in(e)} - known
    assert unknown == set()


def test_every_query_parses(tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, (_, e) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_covers_the_required_views() -> None:
    exprs = " ".join(e for _, e in dashboard_queries())
    for needle in (
        "specroute_requests",  # rate and errors
        "histogram_quantile(0.99, sum by (pool, class, le) (rate(specroute_time_to_first_token_seconds",
        "histogram_quantile(0.5, sum by (pool, class, le) (rate(specroute_time_per_output_token_seconds",
        "specroute_routing_decisions_total",
        "specroute_accepted_tokens_total",
        "specroute_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "specroute_predicted_speedup_ratio_sum",
        'specroute_time_per_output_token_seconds_sum{pool="baseline"',
        "specroute_endpoint_up",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "specroute_classifier_duration_seconds",
    ):
        assert needle in exprs, needle


def test_panels_work_without_recording_rules() -> None:
    """A panel reads raw series, or its description names every recording rule it needs.

    A Prometheus without the rule files loaded (a plain install, an Operator without the PrometheusRule)
    would otherwise show those panels empty with no hint why.
    """
    rules = {r for r, _ in recording_rules()}
    assert rules, "no recording rules found"
    for p in panels():
        if p["type"] == "row":
            continue
        needed = {n for t in p["targets"] for n in series_in(substitute(t["expr"]))} & rules
        assert {r for r in needed if r not in p["description"]} == set(), p["title"]


def test_data_source_is_a_variable() -> None:
    dash = dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == ref, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ref, p["title"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == ref


def test_layout_is_valid() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] >= 38  # Grafana 10
    assert dash["uid"] and "id" not in dash  # provisioned by uid
    all_panels = panels(dash)
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))

    def box(p: dict[str, Any]) -> tuple[int, int, int, int]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        return g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]

    for a, b in combinations(all_panels, 2):
        ax0, ay0, ax1, ay1 = box(a)
        bx0, by0, bx1, by1 = box(b)
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, (a["title"], b["title"])


def test_every_panel_is_described_and_its_targets_unique() -> None:
    for p in panels():
        if p["type"] == "row":
            continue
        assert p.get("description"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_provisioning_loads_the_dashboard() -> None:
    sources = yaml.safe_load(next((GRAFANA_DIR / "provisioning" / "datasources").glob("*.yaml")).read_text())
    assert sources["apiVersion"] == 1
    assert [d["type"] for d in sources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load(next((GRAFANA_DIR / "provisioning" / "dashboards").glob("*.yaml")).read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert DASHBOARD.parent.name == "dashboards" and DASHBOARD.suffix == ".json"
