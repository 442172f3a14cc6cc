"""``specroute bench compare``: the same workload under each routing strategy, on the demo stack.

Two emulated pools (speculative, baseline) stay up for the whole comparison; each strategy gets a
fresh gateway and its own warm-up, so live estimates learnt under one strategy never leak into the
next. Gains are relative to ``always-baseline`` — what a deployment without SpecRoute would see.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway import stack
from gateway.bench import loadgen, results
from gateway.bench.loadgen import Load
from gateway.bench.report import table
from gateway.bench.run import measure
from gateway.bench.workloads import Api, order, prepare, resolve

STRATEGIES = ("always-baseline", "always-speculative", "classifier", "adaptive")
METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "e2e"))
STATS = ("mean", "p50", "p99")


@dataclass
class CompareOptions:
    workload: str = "mixed"
    workload_file: Path | None = None
    api: Api = "completions"
    model: str = "demo-model"
    max_tokens: int = 128
    temperature: float = 0.0
    strategies: Sequence[str] = STRATEGIES
    time_scale: float = 0.2
    warmup: int = 16
    load: Load = field(default_factory=lambda: Load(concurrency=4, requests=120))
    emulator_args: Sequence[str] = ()
    progress: bool = True


def _stack_log_dir(out: Path | None) -> Path:
    if out is not None:
        path = out / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix="specroute-compare-"))


def execute(opts: CompareOptions, out: Path | None = None) -> dict[str, Any]:
    """Run every strategy; returns ``{"config", "strategies": {name: summary + routing}}``."""
    unknown = set(opts.strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; known: {', '.join(STRATEGIES)}")
    workload = resolve(opts.workload, opts.workload_file)
    specs = order(
        prepare(
            workload, api=opts.api, model=opts.model, max_tokens=opts.max_tokens, temperature=opts.temperature
        ),
        opts.load.seed,
    )
    logs = _stack_log_dir(out)
    extra = ["--served-model-name", opts.model, "--time-scale", f"{opts.time_scale:g}", *opts.emulator_args]
    spec = stack.start_emulator("speculative", extra=extra, log_dir=logs)
    with stack.running(spec):
        base = stack.start_emulator("baseline", extra=extra, log_dir=logs)
        with stack.running(base):
            per: dict[str, Any] = {}
            for strategy in opts.strategies:
                cfg = stack.demo_config([spec.url], [base.url], stack.free_port(), opts.model, strategy)
                gw = stack.start_gateway(cfg, logs, name=f"gateway-{strategy}")
                with stack.running(gw):
                    records, elapsed = loadgen.run_sync(
                        measure(gw.url, specs, opts.load, opts.warmup, None, opts.progress, strategy)
                    )
                per[strategy] = {
                    "duration_s": elapsed,
                    "summary": results.summarise(records, elapsed),
                    "routing": results.routing(records),
                }
    return {
        "config": {
            "workload": str(opts.workload_file) if opts.workload_file else workload.name,
            "api": opts.api,
            "model": opts.model,
            "max_tokens": opts.max_tokens,
            "temperature": opts.temperature,
            "time_scale": opts.time_scale,
            "warmup": opts.warmup,
            "load": opts.load.describe(),
            "seed": opts.load.seed,
        },
        "strategies": per,
    }


def _gain(value: float, ref: float | None) -> str:
    if ref is None or ref == 0:
        return ""
    return f" ({(value - ref) / ref:+.0%})"


def _cell(g: dict[str, Any], ref: dict[str, Any] | None, metric: str, stat: str) -> str:
    s = g[metric]
    if not s:
        return "-"
    r = ref[metric][stat] if ref and ref[metric] else None
    return f"{s[stat]:.1f}{_gain(s[stat], r)}"


def _spec_share(routing: dict[str, Any], label: str | None) -> str:
    counts: dict[str, dict[str, int]] = routing["pool_by_class"]
    rows = [counts[label]] if label else list(counts.values())
    total = sum(n for c in rows for n in c.values())
    spec = sum(c.get("speculative", 0) for c in rows)
    return f"{spec / total:.0%}" if total else "-"


def tables(comparison: dict[str, Any]) -> str:
    """One table per group (all, then each class); gains relative to ``always-baseline``."""
    per = comparison["strategies"]
    ref_name = "always-baseline" if "always-baseline" in per else None
    labels = sorted({k for v in per.values() for k in v["summary"]["by_class"]})
    header = ["strategy", "ok", "err", "→spec", *(f"{t} {s}" for _, t in METRICS for s in STATS)]
    parts = []
    for label in [None, *labels]:
        title = "all requests" if label is None else f"class {label}"
        rows = []
        for name, v in per.items():
            groups = v["summary"]["by_class"]
            g = v["summary"]["overall"] if label is None else groups.get(label)
            if g is None:
                continue
            ref = None
            if ref_name and name != ref_name:
                ref_s = per[ref_name]["summary"]
                ref = ref_s["overall"] if label is None else ref_s["by_class"].get(label)
            cells = [_cell(g, ref, m, s) for m, _ in METRICS for s in STATS]
            rows.append([name, str(g["ok"]), str(g["errors"]), _spec_share(v["routing"], label), *cells])
        parts += [f"### {title}", "", table(header, rows), ""]
    return "\n".join(parts)


def markdown(comparison: dict[str, Any]) -> str:
    c = comparison["config"]
    head = [
        "# specroute bench compare",
        "",
        f"Workload `{c['workload']}` ({c['api']}, max_tokens {c['max_tokens']},"
        f" temperature {c['temperature']:g}), {c['load']}, warm-up {c['warmup']} requests per strategy,"
        f" seed {c['seed']}; emulated pools at time scale {c['time_scale']:g}.",
        "Latencies in ms; TPOT from the server's token counts; (±%) relative to `always-baseline`"
        " (negative is faster); →spec: share of requests sent to the speculative pool.",
        "",
    ]
    return "\n".join(head) + "\n" + tables(comparison)


def write(comparison: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_bytes(orjson.dumps(comparison, option=orjson.OPT_INDENT_2))
    (out / "compare.md").write_text(markdown(comparison))
