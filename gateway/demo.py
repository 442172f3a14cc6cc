"""``specroute demo``: one emulated pool of each kind and the gateway, on 127.0.0.1."""

from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path

from gateway import stack

MODEL = "demo-model"

_BANNER = """
SpecRoute demo is up: gateway {url}  (strategy: {strategy}, time scale: {scale})
  speculative pool (emulated): {spec}
  baseline pool    (emulated): {base}
  logs: {logs}

Try it:
  curl -s {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Repeat the following line exactly 40 times: hello world", \\
         "max_tokens": 200, "temperature": 0}}' -D - -o /dev/null | grep -i x-specroute

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


def run_demo(port: int = 8000, strategy: str = "adaptive", time_scale: float = 1.0) -> int:
    logs = Path(tempfile.mkdtemp(prefix="specroute-demo-"))
    extra = ["--served-model-name", MODEL, "--time-scale", str(time_scale)]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
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
