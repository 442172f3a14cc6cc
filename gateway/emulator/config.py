"""Settings of one emulator process: fixed at start-up, some changeable through ``/emulator/control``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["speculative", "baseline"]

#: what ``POST /emulator/control`` may change, with the accepted range
CONTROLS: dict[str, tuple[float, float]] = {
    "acceptance_scale": (0.0, 10.0),
    "error_rate": (0.0, 1.0),
    "hang_rate": (0.0, 1.0),
    "reset_rate": (0.0, 1.0),
    "slow_first_byte_ms": (0.0, 600_000.0),
    "step_ms": (0.0, 60_000.0),
    "draft_cost_ratio": (0.0, 1.0),
    "prefill_ms_per_token": (0.0, 10_000.0),
    "prefill_overhead_ms": (0.0, 60_000.0),
    "time_scale": (0.0, 1000.0),
}


@dataclass
class EmulatorConfig:
    mode: Mode = "speculative"
    served_model_names: list[str] = field(default_factory=lambda: ["demo-model"])
    model: str | None = None
    num_speculative_tokens: int = 7
    draft_cost_ratio: float = 0.05
    step_ms: float = 45.0
    prefill_ms_per_token: float = 0.5
    prefill_overhead_ms: float = 25.0
    max_num_seqs: int = 4
    knee_tokens: int = 64
    max_model_len: int = 1024
    embedding_dim: int = 384  # width of /v1/embeddings vectors
    block_size: int = 16
    time_scale: float = 1.0
    seed: int = 0
    per_request_spec_decode_metrics: Literal["off", "summary"] = "off"
    spec_decode_counters: Literal["on", "zero"] = "on"  # zero: like Neuron's fused speculation
    acceptance_scale: float = 1.0
    acceptance_profile: str = "rules"  # a built-in profile's name or a YAML file (emulator.acceptance)
    error_rate: float = 0.0
    hang_rate: float = 0.0
    reset_rate: float = 0.0
    slow_first_byte_ms: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.mode == "speculative"

    @property
    def root(self) -> str:
        return self.model or self.served_model_names[0]

    @property
    def kv_cache_tokens(self) -> int:
        return self.max_num_seqs * self.max_model_len

    def apply(self, changes: dict[str, Any]) -> None:
        """Validate then apply run-time changes; raises ``ValueError`` naming the bad key."""
        clean: dict[str, float] = {}
        for key, value in changes.items():
            if key not in CONTROLS:
                raise ValueError(f"unknown control {key!r}; known: {', '.join(sorted(CONTROLS))}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            lo, hi = CONTROLS[key]
            if not lo <= value <= hi:
                raise ValueError(f"{key} must be within [{lo:g}, {hi:g}], got {value}")
            clean[key] = float(value)
        for key, value in clean.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
