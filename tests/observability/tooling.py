"""Finding Debian's ``prometheus`` / ``promtool``, installing the package once when they are missing."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
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


@functools.cache
def _install() -> str | None:
    """``apt-get install prometheus`` as root; the reason it could not, else ``None``."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root or no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
    )
    for cmd in steps:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-300:]}"
    # The package may start its own service; tests run their own server on a private port.
    if shutil.which("service"):
        subprocess.run(["service", "prometheus", "stop"], capture_output=True, timeout=30, check=False)
    return None


def binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; installs Debian's package if needed, else skips the test."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found:
        return found
    why = _install()
    found = shutil.which(name)
    if not found:
        pytest.skip(f"`{name}` missing and Debian's prometheus package could not be installed: {why}")
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
