"""Finding Debian's ``prometheus`` / ``promtool`` and the files they check."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "specroute.json"


def rule_files() -> list[Path]:
    return sorted(PROMETHEUS_DIR.glob("*rules*.yml"))


def binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool`` (Debian's package, installed by `.ci/run`), else skip."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not found:
        missing = f"`{name}` missing: install Debian's prometheus package (`make system-deps`)"
        if os.environ.get("CI"):
            pytest.fail(missing)  # CI installs it: a skip there would hide a broken install step
        pytest.skip(missing)
    return found


#: What the dashboard variables stand for when its queries are evaluated outside Grafana:
#: every pool and class ("All"), and a rate window that covers a short test run.
VARIABLES = {"pool": ".*", "class": ".*", "__rate_interval": "1m"}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dash: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, those nested in collapsed rows included."""
    out: list[dict[str, Any]] = []
    for p in (dash or dashboard())["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title / refId, PromQL with the variables substituted)`` for every panel target."""
    return [
        (f"{p['title']} / {t['refId']}", substitute(t["expr"]))
        for p in panels()
        for t in p.get("targets", [])
    ]


def substitute(expr: str, values: dict[str, str] = VARIABLES) -> str:
    """Grafana's ``$name`` / ``${name}`` interpolation, for the variables in ``values``."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def recording_rules() -> list[tuple[str, str]]:
    """``(record, expr)`` of every recording rule."""
    out: list[tuple[str, str]] = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(r["record"], r["expr"]) for r in group["rules"] if "record" in r]
    return out
