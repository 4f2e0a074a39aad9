"""Prometheus metrics: engine gauges read from ``engine.stats()`` at scrape time, and the
latencies and outcomes the HTTP layer measures. Each app has its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_GAUGES = {
    "queue_depth": "requests waiting for a slot",
    "running": "sequences being decoded",
    "kv_blocks_used": "KV cache blocks in use",
    "kv_blocks_free": "KV cache blocks free",
    "kv_blocks_total": "KV cache blocks in all",
}
_COUNTERS = {
    "tokens_generated_total": "tokens generated",
    "prompt_tokens_total": "prompt tokens processed",
}
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _EngineCollector:
    def __init__(self, runner):
        self.runner = runner

    def collect(self):
        stats = self.runner.engine.stats()
        for key, doc in _GAUGES.items():
            g = GaugeMetricFamily(f"minfer_{key}", doc)
            g.add_metric([], float(stats.get(key, 0)))
            yield g
        for key, doc in _COUNTERS.items():
            c = CounterMetricFamily(f"minfer_{key.removesuffix('_total')}", doc)
            c.add_metric([], float(stats.get(key, 0)))
            yield c
        for key, value in stats.items():  # whatever else the engine reports
            if key not in _GAUGES and key not in _COUNTERS and isinstance(value, (int, float)):
                g = GaugeMetricFamily(f"minfer_engine_{key}", f"engine stat '{key}'")
                g.add_metric([], float(value))
                yield g
        g = GaugeMetricFamily("minfer_requests_inflight", "accepted requests not yet finished")
        g.add_metric([], float(self.runner.inflight))
        yield g
        c = CounterMetricFamily("minfer_requests_finished", "accepted requests ended, by finish reason",
                                labels=["finish_reason"])
        for reason, n in sorted(self.runner.finished.items()):
            c.add_metric([reason], float(n))
        yield c


class Metrics:
    def __init__(self, runner):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(runner))
        self.ttft = Histogram("minfer_time_to_first_token_seconds", "submit to first generated text",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("minfer_inter_token_latency_seconds", "time between generated tokens",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("minfer_request_duration_seconds", "submit to final event",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter("minfer_requests", "requests accepted, by endpoint and whether they stream",
                                ["endpoint", "stream"], registry=self.registry)
        self.rejected = Counter("minfer_requests_rejected", "requests answered with an error status",
                                ["status"], registry=self.registry)
