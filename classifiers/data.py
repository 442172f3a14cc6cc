"""Training rows: the public prompts whose licence allows commercial use, plus SpecRoute's own prompts.

The repository carries copies of both (``classifiers/data/``) so that training never needs the shared
corpus. Rows under non-commercial or research-only terms stay out of the repository; the optional
"with restricted rows" measurement reads them from the shared corpus when it is present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).parent / "data"
PUBLIC_FILE = DATA_DIR / "prompts-commercial.jsonl"
OWN_FILE = DATA_DIR / "specroute-prompts.jsonl"
SHARED_FILE = Path("/work/shared/data/prompts-train.jsonl")
OWN_SOURCE = "specroute"

# A licence string is restricted when any of these appear: non-commercial licences, research-only terms,
# LDC-derived data, and underlying datasets whose terms are unspecified (treated as research use only).
_RESTRICTED = re.compile(r"CC-BY-NC|non-commercial|research|LDC|unspecified", re.IGNORECASE)

LABELS = ("structured", "open-ended", "ambiguous")


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    source: str  # repository name without commit and path, or "specroute"
    license: str
    category: str
    label: str  # structured | open-ended | ambiguous
    body: dict[str, Any]  # an OpenAI request body ({"prompt": ...} for the public corpus)

    @property
    def y(self) -> int:
        return 1 if self.label == "structured" else 0


def commercial_ok(license: str) -> bool:
    return not _RESTRICTED.search(license)


def _source_name(source: str) -> str:
    return source.split("@", 1)[0]


def _read(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _row(d: dict[str, Any]) -> Row:
    body = d.get("body") or {"prompt": d["prompt"]}
    return Row(
        id=str(d["id"]),
        source=_source_name(str(d["source"])),
        license=str(d["license"]),
        category=str(d.get("category", "")),
        label=str(d["label"]),
        body=body,
    )


def load(path: Path) -> list[Row]:
    return [_row(d) for d in _read(path)]


def load_training(with_restricted: bool = False) -> list[Row]:
    """Rows the shipped model trains on; ``with_restricted`` swaps in the whole shared corpus."""
    if with_restricted:
        if not SHARED_FILE.exists():
            raise FileNotFoundError(f"{SHARED_FILE} not found: the restricted rows are only read from there")
        public = load(SHARED_FILE)
    else:
        public = load(PUBLIC_FILE)
    return public + load(OWN_FILE)


def vendor(shared: Path = SHARED_FILE, out: Path = PUBLIC_FILE) -> tuple[int, int]:
    """Copy the commercial-use rows of the shared corpus into the repository; returns (kept, dropped)."""
    kept: list[dict[str, Any]] = []
    dropped = 0
    for d in _read(shared):
        if commercial_ok(str(d["license"])):
            kept.append(d)
        else:
            dropped += 1
    _write(kept, out)
    return len(kept), dropped


def _write(rows: Iterable[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for d in rows:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")


def licence_table(rows: Iterable[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    """(source, licence, rows, commercial use allowed) for the model card."""
    counts: dict[tuple[str, str], int] = {}
    for d in rows:
        key = (_source_name(str(d["source"])), str(d["license"]))
        counts[key] = counts.get(key, 0) + 1
    return [(s, lic, n, commercial_ok(lic)) for (s, lic), n in sorted(counts.items())]
