"""vLLM's Prometheus series, kept as plain numbers and rendered by prometheus_client.

The engine updates plain Python attributes on its hot path (no locks, no label lookups); a custom
collector turns them into metric families at scrape time, in vLLM 0.32's order, with its names, help
texts, label names (``engine``, ``model_name``) and histogram buckets (copied from a real server's
``/metrics``). Counters carry ``_created`` samples like the real ones.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exponent += 1


class Histogram:
    __slots__ = ("bounds", "count", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.created = time.time()

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n


class EngineMetrics:
    """Every series the emulator exports, as plain attributes."""

    def __init__(self, num_spec_tokens: int, max_model_len: int, speculative: bool) -> None:
        self.speculative = speculative
        self.zero_spec_counters = False  # export the spec-decode counters at 0 (Neuron's fused speculation)
        self.k = num_spec_tokens
        self.created = time.time()
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted = 0
        self.accepted_per_pos = [0] * num_spec_tokens
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        tok = buckets_1_2_5(max_model_len)
        self.h_prompt_tokens = Histogram(tok)
        self.h_generation_tokens = Histogram(tok)
        self.h_iteration_tokens = Histogram(ITERATION_BUCKETS)
        self.h_max_generation_tokens = Histogram(tok)
        self.h_params_n = Histogram(N_BUCKETS)
        self.h_params_max_tokens = Histogram(tok)
        self.h_ttft = Histogram(TTFT_BUCKETS)
        self.h_itl = Histogram(ITL_BUCKETS)
        self.h_tpot = Histogram(ITL_BUCKETS)
        self.h_e2e = Histogram(LATENCY_BUCKETS)
        self.h_queue = Histogram(LATENCY_BUCKETS)
        self.h_inference = Histogram(LATENCY_BUCKETS)
        self.h_prefill = Histogram(LATENCY_BUCKETS)
        self.h_decode = Histogram(LATENCY_BUCKETS)
        self.h_preemptions = Histogram(PREEMPTION_BUCKETS)
        self.h_prefill_kv = Histogram(tok)


_HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "h_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "h_generation_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "h_iteration_tokens"),
    (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "h_max_generation_tokens",
    ),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "h_params_n"),
    (
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        "h_params_max_tokens",
    ),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "h_ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "h_itl"),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        "h_tpot",
    ),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "h_e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "h_queue"),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        "h_inference",
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        "h_prefill",
    ),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "h_decode"),
    (
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        "h_preemptions",
    ),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "h_prefill_kv",
    ),
)


def _float_str(v: float) -> str:
    return repr(float(v)) if v != float("inf") else "+Inf"


class VllmCollector(Collector):
    def __init__(self, metrics: EngineMetrics, model_name: str, block_size: int, kv_tokens: int) -> None:
        self.m = metrics
        self.labels = {"engine": "0", "model_name": model_name}
        self.block_size = block_size
        self.kv_tokens = kv_tokens

    def _counter(self, name: str, doc: str, series: Iterable[tuple[dict[str, str], float]]) -> Metric:
        metric = Metric(name, doc, "counter")
        created = self.m.created
        for labels, value in series:
            metric.add_sample(name + "_total", labels, float(value))
            metric.add_sample(name + "_created", labels, created)
        return metric

    def _gauge(self, name: str, doc: str, series: Iterable[tuple[dict[str, str], float]]) -> Metric:
        metric = Metric(name, doc, "gauge")
        for labels, value in series:
            metric.add_sample(name, labels, float(value))
        return metric

    def _histogram(self, name: str, doc: str, h: Histogram) -> Metric:
        metric = Metric(name, doc, "histogram")
        labels = self.labels
        acc = 0
        for bound, c in zip((*h.bounds, float("inf")), h.counts, strict=True):
            acc += c
            metric.add_sample(name + "_bucket", {**labels, "le": _float_str(bound)}, float(acc))
        metric.add_sample(name + "_count", labels, float(h.count))
        metric.add_sample(name + "_sum", labels, h.sum)
        metric.add_sample(name + "_created", labels, h.created)
        return metric

    def collect(self) -> Iterator[Metric]:
        m = self.m
        lb = self.labels
        if m.speculative:
            z = 0 if m.zero_spec_counters else 1
            yield self._counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(lb, z * m.num_drafts)]
            )
            yield self._counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(lb, z * m.num_draft_tokens)]
            )
            yield self._counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                [(lb, z * m.num_accepted)],
            )
            yield self._counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [({**lb, "position": str(i)}, z * v) for i, v in enumerate(m.accepted_per_pos)],
            )
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          [(lb, m.running)])  # fmt: skip
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          [(lb, m.waiting)])  # fmt: skip
        yield self._gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: "
            "'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            [({**lb, "reason": "capacity"}, m.waiting), ({**lb, "reason": "deferred"}, 0)],
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [(lb, m.kv_cache_usage)]
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(lb, m.prompt_tokens)],
        )
        yield self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", [(lb, 0)]
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(lb, 0)]
        )
        yield self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [(lb, m.prompt_tokens)]
        )
        yield self._counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [
                ({**lb, "source": "local_compute"}, m.prompt_tokens),
                ({**lb, "source": "local_cache_hit"}, 0),
                ({**lb, "source": "external_kv_transfer"}, 0),
            ],
        )
        yield self._counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", [(lb, 0)]
        )
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", [(lb, m.generation_tokens)]
        )
        yield self._counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [({**lb, "finished_reason": r}, m.success[r]) for r in FINISHED_REASONS],
        )
        for name, doc, attr in _HISTOGRAMS:
            yield self._histogram(name, doc, getattr(m, attr))
        info = Metric("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
        info.add_sample(
            "vllm:cache_config_info",
            {
                "block_size": str(self.block_size),
                "cache_dtype": "auto",
                "enable_prefix_caching": "True",
                "engine": "0",
                "gpu_memory_utilization": "0.92",
                "kv_cache_size_tokens": str(self.kv_tokens),
                "num_gpu_blocks": str(self.kv_tokens // self.block_size),
            },
            1.0,
        )
        yield info


def make_registry(
    metrics: EngineMetrics, model_name: str, block_size: int, kv_tokens: int
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    ProcessCollector(registry=registry)
    registry.register(VllmCollector(metrics, model_name, block_size, kv_tokens))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
