"""``specroute demo``: one emulated pool of each kind and the gateway, on 127.0.0.1.

The pools are sized so that a short load test at 5 requests/s does not queue (``POOL``: 64 sequences
at once on a "GPU" whose step cost grows only beyond 512 verified tokens, with a fast prefill), and
the banner says what the demo sustains before requests queue (:mod:`gateway.emulator.capacity`). It
writes a small tokenizer for the emulated model (:mod:`gateway.emulator.hf_tokenizer`) so that load
tools that need one run offline.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from pathlib import Path

from gateway import stack
from gateway.emulator.capacity import Workload, capacity
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.hf_tokenizer import write as write_tokenizer

MODEL = "demo-model"

#: the demo pools' engine settings (``specroute emulate`` flags and their EmulatorConfig fields)
POOL = {"max_num_seqs": 64, "knee_tokens": 512, "prefill_ms_per_token": 0.1}

#: the request the capacity figure is for
WORKLOAD = Workload(prompt_tokens=256, output_tokens=128, alpha=0.6)

_BANNER = """
SpecRoute demo is up: gateway {url}  (strategy: {strategy}, time scale: {scale})
  speculative pool (emulated): {spec}
  baseline pool    (emulated): {base}
  logs: {logs}

{capacity}

Load test (guidellm 0.8 or newer; it needs a tokenizer, and this one is local):
  HF_HUB_OFFLINE=1 guidellm run --backend kind=openai_http,target={url},model={model} \\
    --tokenizer kind=hf_auto,model={tokenizer} \\
    --profile kind=constant,rate=5 --constraint kind=max_duration,seconds=30 \\
    --data kind=synthetic_text,prompt_tokens=256,output_tokens=128

Try it:
  curl -s {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Repeat the following line exactly 40 times: hello world", \\
         "max_tokens": 200, "temperature": 0}}' -D - -o /dev/null | grep -i x-specroute

  # with the openai SDK (pip install openai):
  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="unused")
stream = client.chat.completions.create(
    model="{model}", stream=True, max_tokens=64,
    messages=[{{"role": "user", "content": "Write a poem about the sea."}}])
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY

Press Ctrl-C to stop.
"""


def capacity_line(time_scale: float, work: Workload = WORKLOAD) -> str:
    """What the demo sustains before requests queue, per pool and whichever way requests are routed."""
    rates = {
        mode: capacity(EmulatorConfig(mode=mode, time_scale=time_scale, **POOL), work)  # type: ignore[arg-type]
        for mode in ("speculative", "baseline")
    }
    spec, base = rates["speculative"], rates["baseline"]
    if time_scale <= 0:
        return "Capacity: unbounded (time scale 0: every answer at once)."
    return (
        f"Capacity before requests queue ({work.prompt_tokens}-token prompts, {work.output_tokens}-token "
        f"answers): about {min(spec, base):.1f} requests/s whichever pool serves them\n"
        f"  (speculative pool {spec:.1f}/s at acceptance {work.alpha:g}, baseline pool {base:.1f}/s; "
        f"{POOL['max_num_seqs']} sequences at once per pool)"
    )


def _pool_flags() -> list[str]:
    return [arg for key, value in POOL.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def run_demo(port: int = 8000, strategy: str = "adaptive", time_scale: float = 1.0) -> int:
    """Run until Ctrl-C; port 0 is a free one. A process that cannot start ends it with one line."""
    port = port or stack.free_port()
    try:
        stack.check_port_free(port)
    except stack.PortInUse as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="specroute-demo-"))
    tokenizer = write_tokenizer(logs / "tokenizer")
    extra = ["--served-model-name", MODEL, "--time-scale", str(time_scale), *_pool_flags()]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return _run(port, strategy, time_scale, logs, tokenizer, extra, stop)
    except stack.PortInUse as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    except stack.StartFailed as e:
        print(e.line(), file=sys.stderr, flush=True)
        return 1


def _run(
    port: int,
    strategy: str,
    time_scale: float,
    logs: Path,
    tokenizer: Path,
    extra: list[str],
    stop: threading.Event,
) -> int:
    spec = stack.start_emulator("speculative", extra=extra, log_dir=logs)
    with stack.running(spec):
        base = stack.start_emulator("baseline", extra=extra, log_dir=logs)
        with stack.running(base):
            config = stack.demo_config([spec.url], [base.url], port, MODEL, strategy)
            gateway = stack.start_gateway(config, logs)
            with stack.running(gateway):
                print(
                    _BANNER.format(
                        url=gateway.url,
                        strategy=strategy,
                        scale=time_scale,
                        spec=spec.url,
                        base=base.url,
                        logs=logs,
                        model=MODEL,
                        capacity=capacity_line(time_scale),
                        tokenizer=tokenizer,
                    ),
                    flush=True,
                )
                while not stop.wait(0.5):
                    for proc in (spec, base, gateway):
                        if proc.popen.poll() is not None:
                            print(f"{proc.name} exited unexpectedly; see {proc.log_path}", flush=True)
                            return 1
    print("stopped.", flush=True)
    return 0
