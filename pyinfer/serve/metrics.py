"""/metrics with prometheus_client: a collector that reads the engine loop's counters at scrape time."""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

# (key in EngineLoop.metrics(), Prometheus name without the pyinfer_ prefix and _total suffix, kind, help)
METRICS = (
    ("waiting", "waiting", "gauge", "requests waiting to be scheduled (queue depth)"),
    ("running", "running", "gauge", "requests in the running batch"),
    ("kv_used_tokens", "kv_used_tokens", "gauge", "KV cache tokens reserved"),
    ("kv_budget_tokens", "kv_budget_tokens", "gauge", "KV cache budget in tokens"),
    ("kv_peak_tokens", "kv_peak_tokens", "gauge", "highest KV reservation seen"),
    ("tokens_per_second", "tokens_per_second", "gauge", "generated tokens per second over the last 10 s"),
    ("requests_total", "requests", "counter", "requests accepted"),
    ("finished_total", "finished", "counter", "requests completed"),
    ("cancelled_total", "cancelled", "counter", "requests cancelled (client gone or stop string)"),
    ("failed_total", "failed", "counter", "requests that ended in an engine error (the others went on)"),
    ("evictions_total", "evictions", "counter", "running requests evicted by the scheduler"),
    ("tokens_generated_total", "tokens_generated", "counter", "tokens sent to clients"),
    ("steps_total", "steps", "counter", "engine steps"),
)


class LoopCollector:
    def __init__(self, loop):
        self.loop = loop

    def collect(self):
        m = self.loop.metrics()
        for key, name, kind, help_ in METRICS:
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(f"pyinfer_{name}", help_, value=m[key])
        yield InfoMetricFamily("pyinfer_scheduler", "scheduling policy", value={"policy": self.loop.policy_name})


def make_registry(loop) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoopCollector(loop))
    return registry


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value} for unlabelled samples (load tests and checks)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}
