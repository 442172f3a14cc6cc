"""Names every layer shares: pools, APIs, prompt classes.

The bottom of the package: it imports nothing from the gateway, and everything else may import it.
"""

from __future__ import annotations

from typing import Literal

PoolName = Literal["speculative", "baseline"]
"""The two pools: the same target model with speculative decoding on, and without it."""

POOL_NAMES: tuple[PoolName, PoolName] = ("speculative", "baseline")

OTHER_POOL: dict[PoolName, PoolName] = {"speculative": "baseline", "baseline": "speculative"}
"""Where a request fails over to: both pools serve the same model, so only the speed changes."""

Api = Literal["completions", "chat"]
"""The OpenAI APIs the gateway classifies and routes."""

Route = Literal[
    "completions",
    "chat",
    "responses",
    "embeddings",
    "tokenize",
    "detokenize",
    "audio",
    "score",
    "rerank",
    "classify",
    "pooling",
    "other",
]
"""Every route the gateway serves, as its metrics and access log name it: a bounded set, whatever the
path (an unknown ``/v1/*`` route passed through is ``other``)."""

RUN_TOKEN_ENV = "SPECROUTE_RUN_TOKEN"
"""Set by :mod:`gateway.stack` for each process it starts; the process echoes it on ``/health``."""

RUN_TOKEN_HEADER = "x-specroute-run"
"""The ``/health`` response header carrying the run token: proof that the process answering a port is
the one just started, not another server that was already there."""

PromptClass = Literal["structured", "open-ended"]
"""What the classifier says of a prompt: predictable output (speculation helps) or open-ended prose."""
