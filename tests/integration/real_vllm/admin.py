"""Read what the gateway says it measured, in the one place the suite depends on its shape.

- ``GET /admin/routing``: ``endpoints`` is a list of what each endpoint's ``/metrics`` last said
  (``pool``, ``endpoint``, ``running``, ``waiting``, ``kv_cache_usage``, ``speculative_counters`` and,
  once an interval had drafts, ``acceptance`` with vLLM's ratios over that interval);
- the gateway's own ``/metrics``: ``specroute_accepted_tokens_total`` and ``specroute_draft_tokens_total``
  sum its per-request acceptance measurements (labelled by prompt class); ``specroute_requests_total``
  counts the requests it has finished.
"""

from __future__ import annotations

from typing import Any

import httpx

from .client import TIMEOUT, metric_value

MEASURED = ("specroute_accepted_tokens", "specroute_draft_tokens")


class AdminShapeError(LookupError):
    """The gateway does not publish a field a test needs (that piece is not there yet)."""


def fetch(gateway_url: str) -> dict[str, Any] | None:
    """The routing document, or None when the gateway has no such endpoint."""
    try:
        r = httpx.get(gateway_url + "/admin/routing", timeout=TIMEOUT)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "json" not in r.headers.get("content-type", ""):
        return None
    doc = r.json()
    return doc if isinstance(doc, dict) else None


def endpoint(doc: dict[str, Any], pool: str) -> dict[str, Any]:
    """The (single) endpoint entry of ``pool``."""
    eps = doc.get("endpoints")
    if not isinstance(eps, list):
        raise AdminShapeError("no `endpoints` list in /admin/routing")
    for ep in eps:
        if isinstance(ep, dict) and ep.get("pool") == pool:
            missing = {"running", "waiting", "kv_cache_usage", "speculative_counters"} - set(ep)
            if missing:
                raise AdminShapeError(f"endpoint entry lacks {sorted(missing)}")
            return ep
    raise AdminShapeError(f"no endpoint of pool {pool} in /admin/routing")


def measured_totals(gateway_url: str) -> tuple[float, float] | None:
    """(accepted, draft) tokens the gateway measured per request so far, over all prompt classes;
    None while it has published no such series (nothing measured yet, or no such feature)."""
    text = httpx.get(gateway_url + "/metrics", timeout=TIMEOUT).text
    acc, drafted = (metric_value(text, f"{name}_total") for name in MEASURED)
    if acc is None and drafted is None:
        return None
    return acc or 0.0, drafted or 0.0


def requests_total(gateway_url: str) -> float:
    """Requests the gateway has finished and recorded (``specroute_requests_total``, all labels)."""
    text = httpx.get(gateway_url + "/metrics", timeout=TIMEOUT).text
    return metric_value(text, "specroute_requests_total") or 0.0
