"""``specroute bench run``: one workload against one URL, written up as results.json, summary.md and plots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench import loadgen, plots, report, results
from gateway.bench.client import Client
from gateway.bench.loadgen import Load, Record, Target
from gateway.bench.workloads import Api, RequestSpec, order, prepare, resolve


@dataclass
class RunOptions:
    url: str
    workload: str = "mixed"
    workload_file: Path | None = None
    api: Api = "completions"
    model: str | None = None
    max_tokens: int = 128
    temperature: float = 0.0
    stream: bool = True
    api_key: str | None = None
    warmup: int = 4
    load: Load = field(default_factory=lambda: Load(requests=100, concurrency=4))
    progress: bool = True


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class TargetError(RuntimeError):
    """The server to measure cannot be reached or does not list its models; the message says what to check."""

    def __init__(self, message: str, answered: bool = True):
        super().__init__(message)
        self.answered = answered


def list_models(url: str, api_key: str | None) -> list[str]:
    """The model names the server at ``url`` lists under ``/v1/models``.

    Asked once before any load is sent, so that a wrong URL, a server that is not up or a missing key
    is one line naming the URL instead of a run of failed requests or a stack of connection errors.
    """
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    where = f"{base}/v1/models"
    try:
        resp = httpx.get(where, headers=auth_headers(api_key), timeout=10.0)
    except httpx.InvalidURL as e:
        raise TargetError(f"--url {url} is not a valid URL: {e}", answered=False) from None
    except httpx.UnsupportedProtocol:
        raise TargetError(f"--url {url} needs a scheme: http://HOST:PORT", answered=False) from None
    except httpx.TimeoutException:
        raise TargetError(
            f"cannot reach {base}: no answer within 10 s (is the server up? check --url)", answered=False
        ) from None
    except httpx.HTTPError as e:
        raise TargetError(
            f"cannot reach {base}: {e} (is the server running? check --url)", answered=False
        ) from None
    if resp.status_code == 401:
        raise TargetError(f"{where} answered 401: pass the server's key with --api-key or OPENAI_API_KEY")
    if resp.status_code != 200:
        raise TargetError(
            f"{where} answered {resp.status_code}: is {base} an OpenAI-compatible server? (check --url)"
        )
    try:
        return [str(m["id"]) for m in resp.json().get("data") or []]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise TargetError(f"{where} did not answer with an OpenAI model list (check --url)") from None


def discover_model(url: str, api_key: str | None) -> str:
    """The first model the server lists: what ``--model`` defaults to."""
    models = list_models(url, api_key)
    if not models:
        raise TargetError(f"{url.rstrip('/').removesuffix('/v1')}/v1/models lists no model; pass --model")
    return models[0]


def reachable(url: str, api_key: str | None) -> None:
    """Raise :class:`TargetError` when nothing answers at ``url``; a missing model list is fine here."""
    try:
        list_models(url, api_key)
    except TargetError as e:
        if not e.answered:
            raise


async def measure(
    url: str,
    specs: Sequence[RequestSpec],
    load: Load,
    warmup: int = 0,
    api_key: str | None = None,
    progress: bool = False,
    desc: str = "bench",
) -> tuple[list[Record], float]:
    """Warm up (results dropped: first connections, caches, the gateway's live estimates), then measure."""
    client = Client(url, auth_headers(api_key))
    target = [Target("", client)]
    try:
        if warmup:
            wl = Load(concurrency=load.concurrency, rate=load.rate, requests=warmup, seed=load.seed + 1)
            await loadgen.generate(target, specs, wl)
        bar = _progress(load, desc) if progress else None
        try:
            return await loadgen.generate(
                target, specs, load, (lambda r: bar.update()) if bar is not None else None
            )
        finally:
            if bar is not None:
                bar.close()
    finally:
        await client.aclose()


def _progress(load: Load, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=load.requests, desc=desc, unit="req", leave=False, dynamic_ncols=True)


def config_dict(opts: RunOptions, model: str, workload: str) -> dict[str, Any]:
    load = asdict(opts.load)
    return {
        "url": opts.url,
        "workload": workload,
        "api": opts.api,
        "model": model,
        "max_tokens": opts.max_tokens,
        "temperature": opts.temperature,
        "stream": opts.stream,
        "warmup": opts.warmup,
        "load": {k: load[k] for k in ("concurrency", "rate", "requests", "duration", "seed", "timeout")},
    }


def execute(opts: RunOptions, out: Path | None, make_plots: bool = True) -> dict[str, Any]:
    """Run the benchmark; write results.json, summary.md and plots into ``out`` when given."""
    model = opts.model or discover_model(opts.url, opts.api_key)
    if opts.model is not None:
        reachable(opts.url, opts.api_key)
    workload = resolve(opts.workload, opts.workload_file)
    specs = prepare(
        workload,
        api=opts.api,
        model=model,
        max_tokens=opts.max_tokens,
        temperature=opts.temperature,
        stream=opts.stream,
    )
    specs = order(specs, opts.load.seed)
    records, elapsed = loadgen.run_sync(
        measure(opts.url, specs, opts.load, opts.warmup, opts.api_key, opts.progress)
    )
    name = str(opts.workload_file) if opts.workload_file else workload.name
    res = results.build(records, elapsed, config_dict(opts, model, name))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        results.write(res, out / "results.json")
        written = plots.write_all(res, out) if make_plots else []
        (out / "summary.md").write_text(report.markdown(res, written))
    return res
