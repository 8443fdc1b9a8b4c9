"""The daemon's statistics as Prometheus metric families: the one mapping from the typed values.

Both ``.hicachefs/metrics`` and the ``--metrics-listen`` endpoint render through
``StatisticsCollector``, so the file and the scrape always agree.

Every number's kind is its field's own (``store.statistics``): a level (capacity, used and free
bytes, pages, files being written, queue lengths, availability) is a gauge named for its unit
(``hicachefs_tier_used_bytes``); a total is a counter, which prometheus_client exposes with the
``_total`` suffix (``hicachefs_tier_hits_total``). The store's sums over its tiers (hits,
evictions, bytes in...) are not exported: ``sum by`` gives them, and a scraper would otherwise
count them twice. Pure functions of the values: thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..typed_stats import LEVEL, numbers
from .statistics import DaemonStatistics

PREFIX = "hicachefs_"

#: Fields whose exported name or help says more than the field's own name.
_NAMES = {"bytes_in": "written_bytes", "bytes_out": "read_bytes"}
_HELP = {
    "capacity_bytes": "Bytes the store can hold: its local tiers' (the tiers below RAM's with --write-through).",
    "used_bytes": "Bytes of the store that cannot take a page now (capacity less free).",
    "free_bytes": "Bytes the store can still take before it evicts a page.",
    "page_bytes": "The stored pages' sizes; a page on two tiers counts once.",
    "pages": "Pages stored; a page on two tiers counts once.",
    "pending_files": "Files being written that are not published yet.",
    "page_inodes": "Published pages the daemon holds an inode for (the kernel has not forgotten them).",
    "misses": "Page reads of a name that no tier holds.",
    "published": "Pages published (a page the ingest file kept as it was is not counted).",
    "tier_capacity_bytes": "Bytes the tier can hold.",
    "tier_used_bytes": "Bytes the tier's pages take up (slots or records).",
    "tier_free_bytes": "Bytes the tier can still take before it drops a page.",
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
    "user_errors": "Requests refused with an error, by the uid of their sender and kind (errno, or internal).",
    "errors_not_logged": "Refused requests that made no log line (past the first of each kind and user).",
    "fuse_requests": "FUSE requests answered, by operation.",
    "ram_share_limit_bytes": "What each share of the RAM tier may hold (the RAM budget), by share.",
    "ram_share_held_bytes": "What each share of the RAM tier holds now, by share.",
}
#: The store's fields that are sums over its tiers (see the module docstring).
_TIER_SUMS = frozenset({"hits", "evictions", "demotions", "promotions", "checksum_failures",
                        "io_errors", "bytes_in", "bytes_out"})


def metric_families(facts: DaemonStatistics) -> list[Metric]:
    """The daemon's statistics as metric families."""
    families: dict[str, Metric] = {}

    def add(field: str, kind: str, value: float, labels: dict[str, str] | None = None) -> None:
        labels = labels or {}
        family = families.get(field)
        if family is None:
            make = GaugeMetricFamily if kind == LEVEL else CounterMetricFamily
            help_text = _HELP.get(field, f"hicachefs {field.replace('_', ' ')}.")
            family = families[field] = make(PREFIX + field, help_text, labels=list(labels))
        family.add_metric(list(labels.values()), float(value))

    for tier in facts.store.tiers:
        for field, kind, value in numbers(tier):
            add("tier_" + _NAMES.get(field, field), kind, value, {"tier": tier.name})
    for err, count in facts.errors.items():
        add("errors", "total", count, {"errno": err})
    budget = getattr(facts.store, "ram_budget", None)  # the engine's statistics have it
    for share, held in (budget.shares.items() if budget is not None else ()):
        add("ram_share_limit_bytes", LEVEL, held.limit_bytes, {"share": share})
        add("ram_share_held_bytes", LEVEL, held.held_bytes, {"share": share})
    for uid, kinds in facts.errors_by_user.items():
        for kind, count in kinds.items():
            add("user_errors", "total", count, {"uid": uid, "kind": kind})
    add("errors_not_logged", "total", facts.errors_not_logged)
    for op, count in facts.requests.items():
        add("fuse_requests", "total", count, {"operation": op})
    for field, kind, value in numbers(facts.store):
        if field not in _TIER_SUMS:
            add(_NAMES.get(field, field), kind, value)
    add("pending_files", LEVEL, facts.pending_files)
    add("page_inodes", LEVEL, facts.page_inodes)
    for field, kind, value in numbers(facts.kernel_cache):
        add(f"kernel_cache_{field}", kind, value)
    return list(families.values())


class StatisticsCollector:
    """A prometheus_client collector over a callable that returns the daemon's statistics.

    Thread-safety is the callable's: the collector runs in whichever thread renders.
    """

    def __init__(self, statistics: Callable[[], DaemonStatistics | None]):
        self.statistics = statistics

    def collect(self) -> Iterator[Metric]:
        facts = self.statistics()
        if facts is not None:
            yield from metric_families(facts)


def registry_of(statistics: Callable[[], DaemonStatistics | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatisticsCollector(statistics))
    return registry


def render(facts: DaemonStatistics) -> bytes:
    """The statistics in Prometheus text format (version 0.0.4), as ``/metrics`` serves it."""
    return generate_latest(registry_of(lambda: facts))
