"""``specroute emulate``: a vLLM-compatible server that emulates speculative decoding."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer


class ModeOpt(StrEnum):
    speculative = "speculative"
    baseline = "baseline"


class CountersOpt(StrEnum):
    on = "on"
    zero = "zero"


class SpecMetricsOpt(StrEnum):
    off = "off"
    summary = "summary"


def emulate_command(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to bind (0: a free one)")] = 8001,
    mode: Annotated[
        ModeOpt, typer.Option(help="speculative (target + draft) or baseline pool")
    ] = ModeOpt.speculative,
    served_model_name: Annotated[
        list[str] | None, typer.Option("--served-model-name", help="model name(s) served (repeatable)")
    ] = None,
    model: Annotated[str | None, typer.Option(help="model path shown as `root` in /v1/models")] = None,
    num_speculative_tokens: Annotated[int, typer.Option(min=1, max=64, help="draft tokens per step (k)")] = 7,
    draft_cost_ratio: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="cost of one draft step relative to a target step (c)")
    ] = 0.05,
    step_ms: Annotated[float, typer.Option(min=0.0, help="target decode step at small batch, ms")] = 45.0,
    prefill_ms_per_token: Annotated[
        float, typer.Option(min=0.0, help="prefill cost per prompt token, ms")
    ] = 0.5,
    prefill_overhead_ms: Annotated[
        float, typer.Option(min=0.0, help="fixed cost of a prefill step, ms")
    ] = 25.0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="most sequences running at once")] = 4,
    knee_tokens: Annotated[
        int, typer.Option(min=1, help="tokens verified per step above which a step costs proportionally more")
    ] = 64,
    max_model_len: Annotated[int, typer.Option(min=2, help="context length (prompt + output tokens)")] = 1024,
    embedding_dim: Annotated[
        int, typer.Option(min=1, max=65536, help="width of /v1/embeddings vectors")
    ] = 384,
    time_scale: Annotated[
        float, typer.Option(min=0.0, help="multiply every delay; 0 = zero-delay mode (answer at once)")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="seed of the emulator's RNGs")] = 0,
    per_request_spec_decode_metrics: Annotated[
        SpecMetricsOpt, typer.Option(help="off | summary: add metrics.speculative_decoding to responses")
    ] = SpecMetricsOpt.off,
    spec_decode_counters: Annotated[
        CountersOpt, typer.Option(help="on | zero: keep the spec-decode counters at 0, as on Neuron")
    ] = CountersOpt.on,
    acceptance_scale: Annotated[
        float, typer.Option(min=0.0, help="multiply every acceptance probability")
    ] = 1.0,
    acceptance_profile: Annotated[
        str,
        typer.Option(
            help="draft model's acceptance: built-in 'rules' (default) or 'skewed-draft', or a YAML rule file"
        ),
    ] = "rules",
    error_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of requests answered 500")] = 0.0,
    hang_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of requests never answered")
    ] = 0.0,
    reset_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of requests whose connection drops mid-body")
    ] = 0.0,
    slow_first_byte_ms: Annotated[
        float, typer.Option(min=0.0, help="wall-clock delay before any response header, ms (not time-scaled)")
    ] = 0.0,
) -> None:
    """Run a vLLM-compatible speculative-decoding emulator."""
    from gateway.emulator.acceptance import load_profile
    from gateway.emulator.config import EmulatorConfig
    from gateway.emulator.server import run

    try:
        load_profile(acceptance_profile)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--acceptance-profile") from None
    cfg = EmulatorConfig(
        mode=mode.value,
        served_model_names=list(served_model_name or ["demo-model"]),
        model=model,
        num_speculative_tokens=num_speculative_tokens,
        draft_cost_ratio=draft_cost_ratio,
        step_ms=step_ms,
        prefill_ms_per_token=prefill_ms_per_token,
        prefill_overhead_ms=prefill_overhead_ms,
        max_num_seqs=max_num_seqs,
        knee_tokens=knee_tokens,
        max_model_len=max_model_len,
        embedding_dim=embedding_dim,
        time_scale=time_scale,
        seed=seed,
        per_request_spec_decode_metrics=per_request_spec_decode_metrics.value,
        spec_decode_counters=spec_decode_counters.value,
        acceptance_scale=acceptance_scale,
        acceptance_profile=acceptance_profile,
        error_rate=error_rate,
        hang_rate=hang_rate,
        reset_rate=reset_rate,
        slow_first_byte_ms=slow_first_byte_ms,
    )
    run(cfg, host, port)
