"""PNG plots of a run: latency CDFs per class and pool, TPOT over time, routing mix over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt


def _series(requests: Sequence[dict[str, Any]], field: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in requests:
        if r["error"] is None and r[field] is not None:
            out.setdefault(f"{r['label']}/{r['pool']}", []).append(r[field])
    return dict(sorted(out.items()))


def latency_cdfs(requests: Sequence[dict[str, Any]], path: Path) -> bool:
    fields = [
        (f, t)
        for f, t in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end"))
        if _series(requests, f)
    ]
    if not fields:
        return False
    fig, axes = plt.subplots(1, len(fields), figsize=(5 * len(fields), 4), squeeze=False)
    for ax, (field, title) in zip(axes[0], fields, strict=True):
        for name, xs in _series(requests, field).items():
            xs = sorted(xs)
            ax.step(
                xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{name} (n={len(xs)})"
            )
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def tpot_over_time(requests: Sequence[dict[str, Any]], path: Path) -> bool:
    points: dict[str, tuple[list[float], list[float]]] = {}
    for r in requests:
        if r["error"] is None and r["tpot_ms"] is not None:
            xs, ys = points.setdefault(f"{r['label']}/{r['pool']}", ([], []))
            xs.append(r["start_s"])
            ys.append(r["tpot_ms"])
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, (xs, ys) in sorted(points.items()):
        ax.scatter(xs, ys, s=6, label=name, alpha=0.7)
    ax.set_title("TPOT over time (per request, by start time)")
    ax.set_xlabel("s since start")
    ax.set_ylabel("TPOT ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def routing_mix(requests: Sequence[dict[str, Any]], path: Path, bins: int = 30) -> bool:
    if not requests:
        return False
    end = max(r["start_s"] for r in requests) or 1.0
    width = end / bins
    pools = sorted({r["pool"] for r in requests})
    counts = {p: [0] * bins for p in pools}
    for r in requests:
        counts[r["pool"]][min(int(r["start_s"] / width), bins - 1)] += 1
    totals = [sum(counts[p][i] for p in pools) or 1 for i in range(bins)]
    xs = [(i + 0.5) * width for i in range(bins)]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.stackplot(xs, *([c / t for c, t in zip(counts[p], totals, strict=True)] for p in pools), labels=pools)
    ax.set_title("routing mix over time (share of requests sent per pool)")
    ax.set_xlabel("s since start")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def write_all(results: dict[str, Any], out: Path) -> list[str]:
    """Write every plot the data allows; returns the file names written (relative to ``out``)."""
    written = []
    for name, fn in (
        ("latency_cdf.png", latency_cdfs),
        ("tpot_over_time.png", tpot_over_time),
        ("routing_mix.png", routing_mix),
    ):
        if fn(results["requests"], out / name):
            written.append(name)
    return written


def _save(fig: Any, path: Path) -> bool:
    """Write a finished figure and free it (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
