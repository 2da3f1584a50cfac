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
    ("kv_committed_tokens", "kv_committed_tokens", "gauge",
     "KV tokens the requests in flight may need at most (prompt + max_tokens each)"),
    ("tokens_per_second", "tokens_per_second", "gauge", "generated tokens per second over the last 10 s"),
    ("requests_total", "requests", "counter", "requests accepted"),
    ("finished_total", "finished", "counter", "requests completed"),
    ("cancelled_total", "cancelled", "counter", "requests cancelled (client gone or stop string)"),
    ("failed_total", "failed", "counter", "requests that ended in an engine error (the others went on)"),
    ("evictions_total", "evictions", "counter", "running requests evicted by the scheduler"),
    ("tokens_generated_total", "tokens_generated", "counter", "tokens sent to clients"),
    ("steps_total", "steps", "counter", "engine steps"),
    ("grammar_masks_total", "grammar_masks", "counter", "token masks computed for constrained sequences"),
    ("grammar_mask_seconds_total", "grammar_mask_seconds", "counter", "time spent computing and unpacking them"),
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


COUNTER_KEYS = tuple(key for key, _, kind, _ in METRICS if kind == "counter")


class ReplicasCollector:
    """The metrics of a Ray Serve deployment's replicas: under the plain server's names their sum (so the chat
    page and dashboards read it as one server; counters include the replicas gone, so they never go back), and
    each replica's own as `pyinfer_replica_*{replica="..."}` (separate names, so a sum() counts nothing twice)."""

    def __init__(self, snapshots: dict[str, dict], departed: dict[str, float] | None = None):
        self.snapshots = snapshots          # {replica id: its EngineLoop.metrics()}
        self.departed = departed or {}      # {counter key: its total over replicas no longer reporting}

    def collect(self):
        yield GaugeMetricFamily("pyinfer_replicas", "replicas reporting", value=len(self.snapshots))
        for key, name, kind, help_ in METRICS:
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            total = sum(m.get(key, 0) for m in self.snapshots.values()) + self.departed.get(key, 0)
            yield family(f"pyinfer_{name}", help_ + " (sum over replicas)", value=total)
            each = family(f"pyinfer_replica_{name}", help_ + " (one replica)", labels=["replica"])
            for replica, m in sorted(self.snapshots.items()):
                each.add_metric([replica], m.get(key, 0))
            yield each


def replicas_text(snapshots: dict[str, dict], departed: dict[str, float] | None = None) -> bytes:
    """Prometheus text of the replicas' metrics (see ReplicasCollector)."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplicasCollector(snapshots, departed))
    return generate_latest(registry)


def make_registry(loop) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoopCollector(loop))
    return registry


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value} for unlabelled samples (load tests and checks)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}
