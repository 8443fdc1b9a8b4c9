"""Statistics as typed, frozen values, as trio's ``statistics()`` are: every field says what it is.

A *level* is a reading that goes up and down (capacity, bytes used, pages, queue lengths,
whether something is available); a *total* a running count since the daemon started (hits,
evictions, bytes read); a *part* a component's own statistics, shown merged into its owner's.
The metrics exporter knows a gauge from a counter by that mark alone, and ``as_dict`` renders a
value for ``.hicachefs/stats``. Pure functions and markers: thread-safe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

LEVEL = "level"
TOTAL = "total"


def level(default: Any = 0, **kw) -> Any:
    """A field that is a reading (a gauge)."""
    return field(default=default, metadata={"kind": LEVEL}, **kw)


def total(default: Any = 0, **kw) -> Any:
    """A field that is a running count (a counter)."""
    return field(default=default, metadata={"kind": TOTAL}, **kw)


def part(factory) -> Any:
    """A field holding a component's own statistics, shown merged into its owner's."""
    return field(default_factory=factory, metadata={"merged": True})


def kind_of(f: dataclasses.Field) -> str | None:
    """LEVEL or TOTAL for a field that is a number to export; None for others (names, parts)."""
    return f.metadata.get("kind")


def numbers(value: Any) -> list[tuple[str, str, Any]]:
    """(name, LEVEL or TOTAL, value) of every number in a statistics value, parts merged in."""
    found = []
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if f.metadata.get("merged"):
            found += numbers(item)
        elif kind_of(f) is not None and isinstance(item, (int, float)):
            found.append((f.name, kind_of(f), item))
    return found


def as_dict(value: Any) -> Any:
    """A statistics value as plain JSON-able data (parts merged into their owner)."""
    if dataclasses.is_dataclass(value):
        facts: dict = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("hidden"):
                continue
            item = as_dict(getattr(value, f.name))
            if f.metadata.get("merged"):
                facts.update(item)
            else:
                facts[f.name] = item
        return facts
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [as_dict(v) for v in value]
    return value
