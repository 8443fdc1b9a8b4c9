"""What SGLang's storage metrics say (``--enable-metrics``): its Prometheus collectors, read back.

SGLang's ``StorageMetricsCollector`` registers its counters and histograms in
``prometheus_client``'s default registry (one collector per process), and the radix cache feeds
it each scheduler step from the backend's ``get_stats()``. Read-only; thread-safe.
"""

from __future__ import annotations

from typing import Dict

from prometheus_client import REGISTRY

#: The storage metrics the demo shows: counters (token totals) and histograms (per call).
COUNTERS = ("sglang:prefetched_tokens_total", "sglang:backuped_tokens_total",
            "sglang:storage_prefetch_hit_tokens_total", "sglang:storage_prefetch_unfulfilled_tokens_total")
HISTOGRAMS = ("sglang:prefetch_pgs", "sglang:backup_pgs", "sglang:prefetch_bandwidth", "sglang:backup_bandwidth")


def storage_metrics() -> Dict[str, float]:
    """``name`` for each counter, ``name:count`` and ``name:sum`` for each histogram, summed over
    label sets; absent metrics are left out."""
    values: Dict[str, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            name = sample.name
            if name in COUNTERS:
                values[name] = values.get(name, 0.0) + sample.value
            for histogram in HISTOGRAMS:
                if name in (f"{histogram}_count", f"{histogram}_sum"):
                    key = f"{histogram}:{name.rsplit('_', 1)[1]}"
                    values[key] = values.get(key, 0.0) + sample.value
    return values
