"""The daemon's statistics as Prometheus metric families: the one mapping from the stats dict.

Both ``.hicachefs/metrics`` and the ``--metrics-listen`` endpoint render through
``StatisticsCollector``, so the file and the scrape always agree.

Levels, which go up and down (capacity, used and free bytes, pages, files being written, queue
lengths, availability), are gauges named for their unit (``hicachefs_tier_used_bytes``).
Running totals are counters, which prometheus_client exposes with the ``_total`` suffix
(``hicachefs_tier_hits_total``). Sums over the tiers that the stats dict also carries at its
top level (hits, evictions, bytes in...) are not exported: ``sum by`` gives them, and a scraper
would otherwise count them twice.

A new statistics field is a counter unless it is a bool or its name is in ``LEVELS`` or ends in
one of ``LEVEL_SUFFIXES``; add a new level there. Pure functions of the dict: thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "hicachefs_"

LEVELS = frozenset({"capacity_bytes", "used_bytes", "free_bytes", "pages", "pending_files",
                    "available", "queue_length", "in_flight",
                    # the shared tier's write-behind, call guard and sweep
                    "queue_pages", "queue_bytes", "queue_max_pages", "queue_max_bytes", "writing",
                    "lag_seconds", "last_lag_seconds", "write_seconds_avg", "io_threads_busy",
                    "io_calls_waiting", "unavailable_seconds", "journal_pending", "eviction_candidates",
                    "fs_free_bytes", "sweep_last_cycle_seconds"})
LEVEL_SUFFIXES = ("_capacity_bytes", "_used_bytes", "_free_bytes", "_pages", "_queue_length", "_queue_bytes",
                  "_in_flight", "_pending", "_available")

#: Fields whose exported name or help says more than the field's own name.
_NAMES = {"bytes_in": "written_bytes", "bytes_out": "read_bytes"}
_HELP = {
    "capacity_bytes": "Bytes the store can hold, over all tiers.",
    "used_bytes": "Bytes the stored pages take up, over all tiers.",
    "free_bytes": "Capacity not taken up by pages, over all tiers.",
    "pages": "Pages stored; a page on two tiers counts once.",
    "pending_files": "Files being written that are not published yet.",
    "misses": "Page reads of a name that no tier holds.",
    "published": "Pages published (a page the ingest file kept as it was is not counted).",
    "tier_capacity_bytes": "Bytes the tier can hold.",
    "tier_used_bytes": "Bytes the tier's pages take up (slots or records).",
    "tier_pages": "Pages held by the tier.",
    "tier_hits": "Page reads the tier served.",
    "tier_misses": "Page reads the tier could not serve.",
    "tier_evictions": "Pages the tier dropped from the store to make room.",
    "tier_demotions": "Pages moved from the tier down to the next.",
    "tier_promotions": "Pages copied up into the tier.",
    "tier_checksum_failures": "Pages the tier found not matching their checksum.",
    "tier_io_errors": "Device calls of the tier that failed.",
    "tier_written_bytes": "Page bytes written into the tier.",
    "tier_read_bytes": "Page bytes read out of the tier.",
    "errors": "Requests refused with an error, by errno.",
    "fuse_requests": "FUSE requests answered, by operation.",
}
#: Top-level fields that are sums over the tiers (see the module docstring).
_TIER_SUMS = frozenset({"hits", "evictions", "demotions", "promotions", "checksum_failures",
                        "io_errors", "bytes_in", "bytes_out"})


def is_level(field: str, value: object) -> bool:
    return isinstance(value, bool) or field in LEVELS or field.endswith(LEVEL_SUFFIXES)


def metric_families(facts: dict) -> list[Metric]:
    """The statistics dict of ``PageStore.statistics`` plus the daemon's counters, as families."""
    families: dict[str, Metric] = {}

    def add(field: str, value: object, labels: dict[str, str] | None = None) -> None:
        if not isinstance(value, (int, float)):
            return
        labels = labels or {}
        family = families.get(field)
        if family is None:
            level = is_level(field.removeprefix("tier_"), value)
            kind = GaugeMetricFamily if level else CounterMetricFamily
            help_text = _HELP.get(field, f"hicachefs {field.replace('_', ' ')}.")
            family = families[field] = kind(PREFIX + field, help_text, labels=list(labels))
        family.add_metric(list(labels.values()), float(value))

    for tier, counters in facts.get("tiers", {}).items():
        for field, value in counters.items():
            add("tier_" + _NAMES.get(field, field), value, {"tier": tier})
    for err, count in facts.get("errors", {}).items():
        add("errors", count, {"errno": err})
    for op, count in facts.get("requests", {}).items():
        add("fuse_requests", count, {"operation": op})
    for field, value in facts.items():
        if field in ("tiers", "errors", "requests") or field in _TIER_SUMS:
            continue
        if isinstance(value, dict):  # a section of its own: flattened into its fields
            for sub, sub_value in value.items():
                add(f"{field}_{sub}", sub_value)
        else:
            add(_NAMES.get(field, field), value)
    return list(families.values())


class StatisticsCollector:
    """A prometheus_client collector over a callable that returns the statistics dict.

    Thread-safety is the callable's: the collector runs in whichever thread renders.
    """

    def __init__(self, statistics: Callable[[], dict | None]):
        self.statistics = statistics

    def collect(self) -> Iterator[Metric]:
        facts = self.statistics()
        if facts is not None:
            yield from metric_families(facts)


def registry_of(statistics: Callable[[], dict | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatisticsCollector(statistics))
    return registry


def render(facts: dict) -> bytes:
    """The statistics in Prometheus text format (version 0.0.4), as ``/metrics`` serves it."""
    return generate_latest(registry_of(lambda: facts))
