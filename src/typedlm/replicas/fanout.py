"""The ingress's /health, /metrics and /v1/systemone/feedback/suggest: every replica's own, as one answer.

/health: the replicas' counters summed at the top level (the single server's shape: status, model, pending,
max_queue, prefix_cache) and each replica's own under "replicas". /metrics: every replica's Prometheus series with
a `replica` label, in one exposition (one scrape target however many replicas there are). Suggestions: one random
draw over every replica's answers, and the most unsure of all of them (`merge_suggestions`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
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


def merge_suggestions(replies: Sequence[Mapping[str, Any]], n: int, rng: random.Random | None = None) -> dict[str, Any]:
    """Every replica's suggestion of what to label next (each at most `n` of each kind) as one: `n` drawn at random
    without replacement from all the replicas' drawable answers (each pick from a replica in proportion to the
    answers left to draw there, taking its own draw's next: a uniform draw over the union, as each replica's is over
    its own), and the `n` most unsure of the answers the replicas would give to teach.

    A replica marks what it suggested as handed out: answers of its draw left out here are so left out of later
    draws (at random: the draws stay fair), and answers to teach left out are stored "chosen" if labeled anyway."""
    rng = rng or random.SystemRandom()
    left = [reply["drawable"] for reply in replies]
    drawn = [list(reply["random"]) for reply in replies]
    merged: list[str] = []
    while len(merged) < n and sum(left) > 0:
        r = rng.choices(range(len(replies)), weights=left)[0]
        if not drawn[r]:  # cannot be: a replica draws min(n, drawable)
            left[r] = 0
            continue
        merged.append(drawn[r].pop(0))
        left[r] -= 1
    unsure = [(u, key) for reply in replies for key, u in zip(reply["teach"], reply["teach_uncertainty"])]
    teach = heapq.nlargest(n, unsure, key=lambda pair: pair[0])
    first = replies[0]
    return {
        **first,
        "answers": sum(reply["answers"] for reply in replies),
        "drawable": sum(reply["drawable"] for reply in replies),
        "random": merged,
        "teach": [key for _, key in teach],
        "teach_uncertainty": [u for u, _ in teach],
    }
