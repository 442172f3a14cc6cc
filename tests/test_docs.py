"""The README stays a five-minute read whose recipe works, and every link in it and in docs/ resolves."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml

from gateway.config import load_settings
from gateway.observe import ACCESS_FIELDS
from gateway.types import Route

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_configuration_for_two_vllm_servers_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    (config,) = [b for b in blocks if "pools:" in b]
    path = tmp_path / "gateway.yaml"
    path.write_text(config)
    settings = load_settings(path)
    assert settings.pools.speculative.num_speculative_tokens == 7
    assert settings.served_models() == yaml.safe_load(config)["pools"]["baseline"]["models"]


def test_the_speculative_server_and_the_gateway_agree_on_k() -> None:
    text = README.read_text()
    spec = re.search(r"--speculative-config '(\{.*?\})'", text)
    assert spec is not None
    assert '"num_speculative_tokens": 7' in spec.group(1)


def _section(page: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    text = page.read_text()
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    ends = [m.start() for m in re.finditer(r"\n(#+) ", text[start + 1 :]) if len(m.group(1)) <= len(level)]
    return text[start : start + 1 + ends[0]] if ends else text[start:]


def _first_column(table: str) -> set[str]:
    """Every backticked name in a Markdown table's first column."""
    cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {name for cell in cells for name in re.findall(r"`([^`]+)`", cell)}


def test_the_access_log_table_names_every_key_and_route() -> None:
    section = _section(ROOT / "docs" / "observability.md", "## Access log")
    assert set(ACCESS_FIELDS) | {"prompt"} == _first_column(section)
    (routes,) = [line for line in section.splitlines() if line.startswith("| `route`")]
    assert set(typing.get_args(Route)) <= set(re.findall(r"`([a-z]+)`", routes.split("|", 2)[2]))
    assert "gateway.observe.ACCESS_FIELDS" in section


def test_the_alerts_table_lists_every_alert_with_its_duration_and_severity() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "specroute-alert-rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    rows = {}
    for line in _section(ROOT / "docs" / "observability.md", "### Alerts").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].startswith("`SpecRoute"):
            rows[cells[0].strip("`")] = (cells[2], cells[3])
    assert rows == {name: (r["for"], r["labels"]["severity"]) for name, r in alerts.items()}
