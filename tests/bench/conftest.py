"""Two time-scaled emulators and a gateway in front of them, shared by the smoke tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway import stack

MODEL = "demo-model"
EXTRA = ["--served-model-name", MODEL, "--time-scale", "0.02", "--max-num-seqs", "16"]


@pytest.fixture(scope="package")
def bench_stack(tmp_path_factory) -> Iterator[dict[str, stack.Process]]:
    logs = tmp_path_factory.mktemp("bench-stack")
    spec = stack.start_emulator("speculative", extra=EXTRA, log_dir=logs)
    with stack.running(spec):
        base = stack.start_emulator("baseline", extra=EXTRA, log_dir=logs)
        with stack.running(base):
            cfg = stack.demo_config([spec.url], [base.url], stack.free_port(), MODEL, "classifier")
            gw = stack.start_gateway(cfg, logs)
            with stack.running(gw):
                yield {"speculative": spec, "baseline": base, "gateway": gw}
