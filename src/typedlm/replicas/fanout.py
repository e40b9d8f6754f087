"""The ingress's /health and /metrics: every replica's own, as one answer.

/health: the replicas' counters summed at the top level (the single server's shape: status, model, pending,
max_queue, prefix_cache) and each replica's own under "replicas". /metrics: every replica's Prometheus series with
a `replica` label, in one exposition (one scrape target however many replicas there are).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


def _summed(values: list[Any]) -> Any:
    """Numbers summed, dicts summed key by key; anything else: the first value (the same on every replica)."""
    if all(isinstance(v, dict) for v in values):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: _summed([v[k] for v in values if k in v]) for k in keys}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values)
    return values[0]


def merge_health(replies: Mapping[str, Mapping[str, Any]], expected: int) -> dict[str, Any]:
    """{replica id: its /health body} → one body: the counters summed, each replica's own under "replicas";
    status "ok" when `expected` replicas answered ok, else "degraded"."""
    bodies = list(replies.values())
    merged = _summed(bodies) if bodies else {}
    healthy = len(bodies) >= expected and all(body.get("status") == "ok" for body in bodies)
    merged["status"] = "ok" if healthy else "degraded"
    merged["replicas_expected"] = expected
    merged["replicas"] = [{"replica": replica, **body} for replica, body in replies.items()]
    return merged


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_metrics(expositions: Mapping[str, str]) -> bytes:
    """{replica id: its /metrics text} → one exposition, every sample labeled with its replica."""
    families: dict[str, Metric] = {}
    for replica, text in expositions.items():
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                labels = {**sample.labels, "replica": replica}
                merged.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
