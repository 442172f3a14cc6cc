"""``vllm bench serve``, the tool vLLM's users benchmark a server with, against the gateway.

It streams every request with ``stream_options.include_usage``, reads the output length from the last
usage chunk and times each event that carries a choice. Through the gateway every request must
complete with the length asked for (``--ignore-eos``), and the events must arrive one by one, as vLLM
sent them: at most ``k + 1`` tokens each, never the whole answer at once.
"""

from __future__ import annotations

import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .servers import MODEL_NAME, NUM_SPECULATIVE_TOKENS, VllmServer, VllmSetup, server_env

pytestmark = pytest.mark.real_vllm

PROMPTS = 16
INPUT_LEN = 64
OUTPUT_LEN = 24
BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


def _bench(setup: VllmSetup, url: str, backend: str, out: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` run (random prompts cut with the local target's tokenizer): its results."""
    args = [
        str(setup.venv / "bin" / "vllm"),
        "bench",
        "serve",
        "--backend",
        backend,
        "--base-url",
        url,
        "--endpoint",
        BACKENDS[backend],
        "--model",
        MODEL_NAME,
        "--tokenizer",
        str(setup.models / "target"),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(PROMPTS),
        "--request-rate",
        "8",
        "--seed",
        "1",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        f"{backend}.json",
    ]
    tmp = out / f"tmp-{backend}"
    tmp.mkdir()
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=server_env(setup, tmp))
    result = out / f"{backend}.json"
    assert done.returncode == 0 and result.exists(), f"vllm bench serve failed:\n{done.stdout[-3000:]}"
    return dict(json.loads(result.read_text()))


def test_vllm_bench_serve_through_the_gateway(
    vllm_setup: VllmSetup,
    gateway: str,
    baseline: VllmServer,
    speculative: VllmServer,
    tmp_path: Path,
) -> None:
    with ThreadPoolExecutor(len(BACKENDS)) as pool:  # each run spends ~10 s importing vLLM: side by side
        runs = {b: pool.submit(_bench, vllm_setup, gateway, b, tmp_path) for b in BACKENDS}
    for backend, run in runs.items():
        result = run.result()
        errors = [e for e in result["errors"] if e]
        assert result["completed"] == PROMPTS and result["failed"] == 0, (backend, errors[:2])
        assert result["output_lens"] == [OUTPUT_LEN] * PROMPTS, backend
        assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN, backend
        assert all(ttft > 0 for ttft in result["ttfts"]), backend
        # one timed event per engine step: OUTPUT_LEN tokens take at least this many, the first included
        fewest = math.ceil(OUTPUT_LEN / (NUM_SPECULATIVE_TOKENS + 1))
        assert all(len(itl) + 1 >= fewest for itl in result["itls"]), backend
