"""Markdown tables from ``results.json`` dictionaries (``summary.md``, and the terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table whose columns line up in a terminal too."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
            + " |"
        )

    rule = (
        "|" + "|".join("-" * (w + 1) + ":" if i else ":" + "-" * (w + 1) for i, w in enumerate(widths)) + "|"
    )
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def ms(stats: dict[str, float] | None, key: str) -> str:
    return "-" if not stats else f"{stats[key]:.1f}"


def _row(name: str, g: dict[str, Any]) -> list[str]:
    tpc = g["tokens_per_chunk"]
    return [
        name,
        str(g["ok"]),
        str(g["errors"]),
        ms(g["ttft_ms"], "p50"),
        ms(g["ttft_ms"], "p99"),
        ms(g["tpot_ms"], "mean"),
        ms(g["tpot_ms"], "p50"),
        ms(g["tpot_ms"], "p99"),
        ms(g["e2e_ms"], "p50"),
        ms(g["e2e_ms"], "p99"),
        "-" if not tpc else f"{tpc['mean']:.2f}",
        f"{g['requests_per_s']:.1f}",
        f"{g['output_tokens_per_s']:.0f}",
    ]


HEADER = [
    "group",
    "ok",
    "err",
    "TTFT p50",
    "TTFT p99",
    "TPOT mean",
    "TPOT p50",
    "TPOT p99",
    "e2e p50",
    "e2e p99",
    "tok/chunk",
    "req/s",
    "tok/s",
]


def summary_table(results: dict[str, Any]) -> str:
    s = results["summary"]
    rows = [_row("all", s["overall"])]
    rows += [_row(f"class {k}", g) for k, g in s["by_class"].items()]
    rows += [_row(f"pool {k}", g) for k, g in s["by_pool"].items()]
    if len(s["by_pool"]) > 1:
        rows += [_row(k, g) for k, g in s["by_class_pool"].items()]
    return table(HEADER, rows)


def routing_table(results: dict[str, Any]) -> str:
    counts: dict[str, dict[str, int]] = results["routing"]["pool_by_class"]
    pools = sorted({p for c in counts.values() for p in c})
    rows = [[label, *(str(c.get(p, 0)) for p in pools)] for label, c in counts.items()]
    return table(["class \\ pool", *pools], rows)


def markdown(results: dict[str, Any], plots: Sequence[str] = ()) -> str:
    c = results["config"]
    load = c["load"]
    mode = (
        f"open loop, Poisson {load['rate']:g} req/s"
        if load["rate"]
        else f"closed loop, concurrency {load['concurrency']}"
    )
    stop = f"{load['requests']} requests" if load["requests"] else f"{load['duration']:g} s"
    agreement = results["routing"]["class_agreement"]
    streamed = "streamed" if c["stream"] else "not streamed"
    errors = [r["error"] for r in results["requests"] if r["error"]]
    parts = [
        "# specroute bench run",
        "",
        f"- target: `{c['url']}` ({c['api']}, model `{c['model']}`, {streamed})",
        f"- workload: `{c['workload']}`, max_tokens {c['max_tokens']}, temperature {c['temperature']:g}",
        f"- load: {mode}, {stop}, warm-up {c['warmup']} requests, seed {load['seed']}",
        f"- elapsed: {results['duration_s']:.1f} s",
        "",
        "Latencies in ms. TPOT = (e2e - TTFT) / (completion_tokens - 1) with the server's `usage` count;",
        "tok/chunk > 1 means several tokens arrive per stream chunk (speculative decoding).",
        "",
        summary_table(results),
        "",
        "## Routing",
        "",
        routing_table(results),
    ]
    if agreement is not None:
        parts += [
            "",
            f"Gateway class agreed with the workload label for {agreement:.0%} of labelled requests.",
        ]
    if errors:
        parts += ["", "## Errors", "", *(f"- `{e}`" for e in errors[:10])]
    if plots:
        parts += ["", "## Plots", "", *(f"![{p}]({p})" for p in plots)]
    return "\n".join(parts) + "\n"
