"""``specroute bench``: run (any OpenAI URL), compare (routing strategies), overhead (the gateway's cost)."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from gateway.extras import require

if TYPE_CHECKING:
    from gateway.bench.loadgen import Load

bench_app = typer.Typer(
    help="Benchmark an OpenAI-compatible endpoint, the routing strategies, or the gateway's own overhead.",
    no_args_is_help=True,
)

T = TypeVar("T")


class WorkloadOpt(StrEnum):
    structured = "structured"
    open_ended = "open-ended"
    mixed = "mixed"
    mixed_formats = "mixed-formats"


class ApiOpt(StrEnum):
    completions = "completions"
    chat = "chat"


Concurrency = Annotated[int, typer.Option(min=1, help="closed loop: requests in flight")]
Rate = Annotated[
    float | None, typer.Option(min=0.001, help="open loop: Poisson arrivals per second (seeded)")
]
Duration = Annotated[float | None, typer.Option(min=0.01, help="stop sending after this many seconds")]
Seed = Annotated[int, typer.Option(help="seed of the prompt order and of the arrivals")]
Workload = Annotated[WorkloadOpt, typer.Option(help="built-in prompt set")]
WorkloadFile = Annotated[
    Path | None,
    typer.Option(exists=True, dir_okay=False, help="JSONL of prompts or request bodies (`label`: class)"),
]
Api = Annotated[ApiOpt, typer.Option(help="endpoint for plain prompts")]
MaxTokens = Annotated[int, typer.Option(min=1)]
Temperature = Annotated[float, typer.Option(min=0.0)]


def _load(
    concurrency: int,
    rate: float | None,
    requests: int | None,
    duration: float | None,
    seed: int,
    default: int,
) -> Load:
    from gateway.bench.loadgen import Load

    if requests is None and duration is None:
        requests = default
    return Load(concurrency=concurrency, rate=rate, requests=requests, duration=duration, seed=seed)


@bench_app.command("run")
def run_command(
    url: Annotated[str, typer.Option(help="base URL of the server (with or without /v1)")],
    workload: Workload = WorkloadOpt.mixed,
    workload_file: WorkloadFile = None,
    api: Api = ApiOpt.completions,
    model: Annotated[str | None, typer.Option(help="model name [default: the first in /v1/models]")] = None,
    max_tokens: MaxTokens = 128,
    temperature: Temperature = 0.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="sent as a Bearer token")
    ] = None,
    stream: Annotated[bool, typer.Option(help="stream responses (needed for TTFT and TPOT)")] = True,
    concurrency: Concurrency = 4,
    rate: Rate = None,
    requests: Annotated[int | None, typer.Option(min=1, help="requests to measure [default: 100]")] = None,
    duration: Duration = None,
    warmup: Annotated[int, typer.Option(min=0, help="requests sent first and not measured")] = 4,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(min=0.1, help="per-request limit, seconds")] = 600.0,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("bench-results"),
    plots: Annotated[bool, typer.Option(help="write PNG plots")] = True,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Load-test one URL; write results.json, summary.md and plots, per prompt class and per pool."""
    require("bench", "specroute bench")
    from gateway.bench import report
    from gateway.bench.run import RunOptions, execute, reachable

    load = _load(concurrency, rate, requests, duration, seed, 100)
    load.timeout = timeout
    opts = RunOptions(
        url=url,
        workload=workload.value,
        workload_file=workload_file,
        api=api.value,
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        stream=stream,
        api_key=api_key,
        warmup=warmup,
        load=load,
        progress=progress,
    )
    _or_exit(lambda: reachable(url, api_key))
    typer.echo(f"bench run: {url}, {workload_file or workload.value}, {load.describe()}", err=True)
    res = _or_exit(lambda: execute(opts, out, make_plots=plots))
    typer.echo(report.summary_table(res))
    typer.echo(f"\nwrote {out}/results.json, {out}/summary.md", err=True)
    if res["summary"]["overall"]["ok"] == 0:
        raise typer.Exit(1)


@bench_app.command("compare")
def compare_command(
    workload: Workload = WorkloadOpt.mixed,
    workload_file: WorkloadFile = None,
    api: Api = ApiOpt.completions,
    model: Annotated[str, typer.Option(help="model name the emulators serve")] = "demo-model",
    max_tokens: MaxTokens = 128,
    temperature: Temperature = 0.0,
    strategy: Annotated[
        list[str] | None, typer.Option("--strategy", help="repeatable [default: all four]")
    ] = None,
    time_scale: Annotated[
        float, typer.Option(min=0.0, help="multiply emulated delays (smaller: faster)")
    ] = 0.2,
    concurrency: Concurrency = 4,
    rate: Rate = None,
    requests: Annotated[int | None, typer.Option(min=1, help="requests per strategy [default: 120]")] = None,
    duration: Duration = None,
    warmup: Annotated[int, typer.Option(min=0, help="requests per strategy before measuring")] = 16,
    seed: Seed = 0,
    out: Annotated[Path, typer.Option(help="output directory (compare.md, compare.json, logs/)")] = Path(
        "bench-compare"
    ),
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Run one workload under each routing strategy on two emulated pools; print the gains table."""
    require("bench", "specroute bench")
    from gateway.bench import compare

    opts = compare.CompareOptions(
        workload=workload.value,
        workload_file=workload_file,
        api=api.value,
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        strategies=strategy or compare.STRATEGIES,
        time_scale=time_scale,
        warmup=warmup,
        load=_load(concurrency, rate, requests, duration, seed, 120),
        progress=progress,
    )
    result = _or_exit(lambda: compare.execute(opts, out))
    _or_exit(lambda: compare.write(result, out))
    typer.echo(compare.markdown(result))
    typer.echo(f"wrote {out}/compare.md, {out}/compare.json", err=True)


@bench_app.command("learning")
def learning_command(
    acceptance_profile: Annotated[
        str,
        typer.Option(
            help="the emulated draft model: 'skewed-draft', 'rules', 'output-format' or a YAML rule file"
        ),
    ] = "skewed-draft",
    rate: Annotated[
        list[float] | None,
        typer.Option("--rate", min=0.001, help="emulated req/s, repeatable [default: 1, 4, 20]"),
    ] = None,
    requests: Annotated[int, typer.Option(min=2, help="requests per strategy and load")] = 400,
    max_tokens: MaxTokens = 64,
    time_scale: Annotated[float, typer.Option(min=0.001, help="multiply emulated delays")] = 0.1,
    draft_cost_ratio: Annotated[float, typer.Option(min=0.0, max=1.0, help="the emulated draft's c")] = 0.05,
    strategy: Annotated[
        list[str] | None, typer.Option("--strategy", help="repeatable [default: all]")
    ] = None,
    seed: Seed = 0,
    out: Annotated[Path | None, typer.Option(help="write learning.md and learning.json here")] = None,
    virtual: Annotated[
        bool,
        typer.Option(help="replay in virtual time: the emulator's model and the real policy, no processes"),
    ] = False,
    restarted: Annotated[
        bool,
        typer.Option(
            help="with --virtual: each gateway restarts from the state an earlier run of the workload left"
            " (routing.state_file)"
        ),
    ] = False,
    first_half: Annotated[
        bool, typer.Option(help="with --virtual: judge each run's first half (what a restart changes)")
    ] = False,
    workload: Annotated[
        WorkloadOpt,
        typer.Option(
            help="built-in prompt set (mixed-formats: every other structured task asks for a haiku)"
        ),
    ] = WorkloadOpt.mixed,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="every request's sampling temperature (lowers the emulated alpha)")
    ] = 0.0,
    switch_at: Annotated[
        int | None,
        typer.Option(min=0, help="with --virtual: the draft changes to --then-profile from this request on"),
    ] = None,
    then_profile: Annotated[
        str | None, typer.Option(help="with --switch-at: the draft deployed mid-run (a profile, as above)")
    ] = None,
) -> None:
    """Each strategy, fresh, on a draft model unlike the classifier's prior, at several loads."""
    require("bench", "specroute bench")
    import orjson

    from gateway.bench import learning

    opts = learning.LearningOptions(
        profile=acceptance_profile,
        rates=rate or (1.0, 4.0, 20.0),
        requests=requests,
        max_tokens=max_tokens,
        time_scale=time_scale,
        draft_cost_ratio=draft_cost_ratio,
        strategies=strategy or learning.STRATEGIES,
        seed=seed,
        restarted=restarted,
        first_half=first_half,
        workload=workload.value,
        temperature=temperature,
        switch_at=switch_at,
        then_profile=then_profile,
    )
    if (restarted or first_half or switch_at is not None) and not virtual:
        typer.echo("--restarted, --first-half and --switch-at need --virtual", err=True)
        raise typer.Exit(2)
    if (switch_at is None) != (then_profile is None):
        typer.echo("--switch-at and --then-profile go together", err=True)
        raise typer.Exit(2)
    logs = None
    if out is not None:
        logs = out / "logs"
        _or_exit(lambda: logs.mkdir(parents=True, exist_ok=True))
    if virtual:
        from gateway.bench import simulate

        result = _or_exit(lambda: simulate.execute(opts))
    else:
        result = _or_exit(lambda: learning.execute(opts, logs))
    text = learning.markdown(result)
    if out is not None:
        _or_exit(
            lambda: (out / "learning.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        )
        _or_exit(lambda: (out / "learning.md").write_text(text))
    typer.echo(text)


@bench_app.command("learning-cost")
def learning_cost_command(
    requests: Annotated[int, typer.Option(min=100, help="requests to time")] = 5000,
    seed: Seed = 0,
) -> None:
    """Time the per-request acceptance model: features, prediction and update, per request."""
    from gateway.bench import learning

    r = learning.cost(requests, seed)
    typer.echo(
        f"per request over {int(r['requests'])}: features {r['extract_us']:.1f} µs, prediction"
        f" {r['predict_us']:.1f} µs, update {r['update_us']:.1f} µs; total {r['total_us']:.1f} µs"
        f" (p99 {r['total_p99_us']:.1f} µs)"
    )


@bench_app.command("overhead")
def overhead_command(
    rate: Annotated[
        float, typer.Option(min=1.0, help="req/s to each of direct and proxied (open loop)")
    ] = 500.0,
    duration: Annotated[float, typer.Option(min=0.5, help="seconds per phase")] = 10.0,
    stream: Annotated[bool, typer.Option(help="also measure the streamed path (added TTFT)")] = True,
    max_throughput: Annotated[
        bool, typer.Option(help="also run a closed loop through the gateway and report req/s sustained")
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="closed loop for --max-throughput")] = 64,
    max_tokens: MaxTokens = 16,
    model: Annotated[str | None, typer.Option(help="model name [default: demo-model, or discovered]")] = None,
    strategy: Annotated[str, typer.Option(help="routing strategy of the started gateway")] = "classifier",
    gateway_url: Annotated[str | None, typer.Option(help="use an already-running gateway…")] = None,
    upstream_url: Annotated[str | None, typer.Option(help="…and the zero-delay upstream behind it")] = None,
    gateway_pid: Annotated[int | None, typer.Option(help="pid of that gateway, for CPU and RSS")] = None,
    pin: Annotated[bool, typer.Option(help="pin gateway to CPU 0, emulator and client to CPU 1")] = False,
    warmup: Annotated[
        float, typer.Option(min=0.0, help="seconds of interleaved load before measuring")
    ] = 1.0,
    seed: Seed = 0,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the report as JSON")] = None,
    workdir: Annotated[Path | None, typer.Option(help="where started processes keep config and logs")] = None,
) -> None:
    """Measure the latency the gateway adds (proxied - direct, interleaved) and its CPU and memory."""
    require("bench", "specroute bench")
    import orjson

    from gateway.bench import overhead

    opts = overhead.OverheadOptions(
        rate=rate,
        duration=duration,
        stream=stream,
        max_throughput=max_throughput,
        concurrency=concurrency,
        max_tokens=max_tokens,
        model=model,
        strategy=strategy,
        gateway_url=gateway_url,
        upstream_url=upstream_url,
        gateway_pid=gateway_pid,
        pin=pin,
        warmup_s=warmup,
        seed=seed,
    )
    if workdir is not None:
        _or_exit(lambda: workdir.mkdir(parents=True, exist_ok=True))
    report = _or_exit(lambda: overhead.execute(opts, workdir))
    typer.echo(overhead.text(report))
    if json_path is not None:
        _or_exit(lambda: json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2)))


def _or_exit(run: Callable[[], T]) -> T:
    """Run a command's work; each failure is one line.

    Bad options (an output folder that cannot be written, too) exit 2, a stack process that did not
    start exits 1.
    """
    from gateway.stack import StartFailed

    try:
        return run()
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    except StartFailed as e:
        typer.echo(e.line(), err=True)
        raise typer.Exit(1) from None
    except (RuntimeError, TimeoutError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except OSError as e:
        if e.filename is None:
            raise
        typer.echo(f"{e.filename}: {e.strerror}", err=True)  # an --out or --workdir that cannot be used
        raise typer.Exit(2) from None
