"""Prometheus metrics and the per-request log line, from one observation per request.

Exposed at /metrics (prometheus_client's text format, one registry per app):

    typedlm_requests_total{route,status}        requests answered, by route template and status code
    typedlm_request_seconds{route}              whole request time (histogram)
    typedlm_queue_wait_seconds                  time a request waited for the model thread (histogram)
    typedlm_forward_seconds                     time on the model thread: tokenizing, the forward, answers
    typedlm_input_tokens_total                  prompt tokens of answered requests (usage.input_tokens)
    typedlm_cached_tokens_total                 of them, served from the prefix cache
    typedlm_questions_total{type}               questions answered, by type
    typedlm_requests_pending                    requests running or waiting for the model thread (gauge)
    typedlm_prefix_cache_*                      the prefix cache's counters (hits_total, ...) and sizes
    typedlm_cache_{bytes,max_bytes,entries}{cache}  every other cache kept across requests (documents' ids,
                                                suffix texts and ids, option names, priors, packed layouts), in bytes;
                                                typedlm_cache_{hits,misses,evictions}_total{cache}
    typedlm_process_{resident,peak_resident}_bytes  the model's process's memory (with --model-process, read live)
    process_*                                   this HTTP process's memory, CPU and file descriptors
    typedlm_cuda_graphs_captures_total          CUDA graphs captured (on a GPU; a capture holds up the forwards
                                                behind it); typedlm_cuda_graphs_held: graphs held now;
                                                typedlm_cuda_graphs_capture_failures_total: captures that failed
                                                (their shapes then run eagerly: slower, still answered)
    typedlm_model_thread_waited_for_slot_seconds_total      the model thread's time waiting for a forward in flight
                                                to end (the device sets the pace: more forwards than it can run)
    typedlm_model_thread_waited_for_requests_seconds_total  ... waiting for a request with a slot free (the clients,
                                                or the threads preparing requests, set the pace; idle time too)
    typedlm_answer_window_{entries,bytes,max_bytes,max_age_seconds}  with a feedback database: recent answers held
                                                for labels by id (x_id), their bytes and the bounds;
                                                typedlm_answer_window_evictions_total: answers let go of (bytes, age);
                                                typedlm_answer_window_labeled_by_id_total: answers labeled by id;
                                                typedlm_answer_window_not_held_total: ids posted and not held (404)
    typedlm_model_info{model,device,dtype,...}  the served model (always 1)

`RequestLog` writes one line per request (text, or JSON with `--log-format json`): route, status, ms, tokens,
cached tokens, questions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from typedlm.core.description import ModelDescription

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # requests per forward
# counters; the rest are sizes
CUMULATIVE = (
    "hits", "partial_hits", "misses", "reused_tokens", "captures", "capture_failures", "waited_for_slot_seconds",
    "waited_for_requests_seconds", "evictions", "labeled_by_id", "not_held",
)  # fmt: skip
ROUTES = (
    "/",
    "/playground",
    "/v1/systemone",
    "/v1/systemone/feedback",
    "/v1/systemone/feedback/suggest",
    "/v1/models",
    "/v1/chat/completions",
    "/health",
    "/metrics",
    "/docs",
    "/openapi.json",
)
LOG = logging.getLogger("typedlm.requests")


@dataclass
class RequestRecord:
    """What one request did, filled in as it goes (`request.state.record`)."""

    route: str
    status: int = 0
    seconds: float = 0.0
    input_tokens: int | None = None
    cached_tokens: int | None = None
    questions: dict[str, int] = field(default_factory=dict)  # type → count

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route, "status": self.status, "ms": round(self.seconds * 1000, 2)}
        if self.input_tokens is not None:
            out |= {"input_tokens": self.input_tokens, "cached_tokens": self.cached_tokens}
        if self.questions:
            out["questions"] = dict(self.questions)
        return out


def route_of(path: str) -> str:
    """A route label with bounded cardinality: a known route, the docs' assets, or "other"."""
    if path in ROUTES:
        return path
    return "/docs-assets" if path.startswith("/docs-assets/") else "other"


class _Live(Collector):
    """Values read at scrape time: the queue, the prefix cache's counters and the CUDA graphs'."""

    def __init__(self, pending: Callable[[], int], stats: Callable[[], Mapping[str, Mapping[str, float]]]):
        self._pending, self._stats = pending, stats

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "typedlm_requests_pending", "Requests running or waiting for the model thread", value=self._pending()
        )
        for group, counters in self._stats().items():
            if group == "caches":
                yield from _labelled("typedlm_cache", "cache", counters)
                continue
            for name, value in counters.items():
                metric = f"typedlm_{group}_{name}"
                if name in CUMULATIVE:
                    yield CounterMetricFamily(metric, f"{group}: {name}", value=value)
                else:
                    yield GaugeMetricFamily(metric, f"{group}: {name}", value=value)


def _labelled(prefix: str, label: str, members: Mapping[str, Mapping[str, float]]) -> Iterator[Any]:
    """One family per counter (`prefix_name{label=member}`) from {member: {name: value}}."""
    families: dict[str, Any] = {}
    for member, counters in members.items():
        for name, value in counters.items():
            if name not in families:
                kind = CounterMetricFamily if name in CUMULATIVE else GaugeMetricFamily
                families[name] = kind(f"{prefix}_{name}", f"{prefix}: {name}, per {label}", labels=[label])
            families[name].add_metric([member], value)
    yield from families.values()


class ServerMetrics:
    def __init__(
        self,
        model: ModelDescription,
        pending: Callable[[], int],
        stats: Callable[[], Mapping[str, Mapping[str, float]]],
    ):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "typedlm_requests", "Requests answered, by route and status", ["route", "status"], registry=registry
        )
        self.latency = Histogram(
            "typedlm_request_seconds", "Whole request time", ["route"], buckets=LATENCY_BUCKETS, registry=registry
        )
        self.queue_wait = Histogram(
            "typedlm_queue_wait_seconds",
            "Time waiting for the model thread",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.forward = Histogram(
            "typedlm_forward_seconds",
            "Time of the forward (and answers) that served a request, shared with the requests batched with it",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_requests = Histogram(
            "typedlm_batch_requests",
            "Requests answered by one forward",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_tokens = Counter(
            "typedlm_batch_tokens", "Tokens of the requests put through forwards", registry=registry
        )
        self.input_tokens = Counter("typedlm_input_tokens", "Prompt tokens of answered requests", registry=registry)
        self.cached_tokens = Counter(
            "typedlm_cached_tokens", "Prompt tokens served from the prefix cache", registry=registry
        )
        self.questions = Counter("typedlm_questions", "Questions answered, by type", ["type"], registry=registry)
        Info("typedlm_model", "The served model", registry=registry).info(model.labels())
        registry.register(_Live(pending, stats))
        ProcessCollector(registry=registry)  # this process's memory: with a model process, the model's is apart

    def batch(self, requests: int, tokens: int) -> None:
        """One forward of the model worker: how many requests it answered, and their tokens."""
        self.batch_requests.observe(requests)
        self.batch_tokens.inc(tokens)

    def timing(self, wait_s: float, run_s: float) -> None:
        """The model worker's measurements of one request."""
        self.queue_wait.observe(wait_s)
        self.forward.observe(run_s)

    def observe(self, record: RequestRecord) -> None:
        self.requests.labels(record.route, str(record.status)).inc()
        self.latency.labels(record.route).observe(record.seconds)
        if record.input_tokens is not None:
            self.input_tokens.inc(record.input_tokens)
            self.cached_tokens.inc(record.cached_tokens or 0)
        for kind, count in record.questions.items():
            self.questions.labels(kind).inc(count)


class RequestLog:
    """One line per request on the `typedlm.requests` logger: `key=value` text, or JSON."""

    def __init__(self, json_lines: bool = False):
        self.json_lines = json_lines

    def write(self, record: RequestRecord) -> None:
        fields = record.to_json()
        if self.json_lines:
            LOG.info(json.dumps(fields, ensure_ascii=False))
        else:
            LOG.info(" ".join(f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in fields.items()))
