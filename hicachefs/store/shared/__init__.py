"""The shared tier: pages on a distributed filesystem that several hosts mount (see ``tier``).

``SharedTier`` is imported on first use (PEP 562): ``hicachefs mount`` reads ``engine_checks``
alone, without the tier's code and numpy.
"""

__all__ = ["SharedTier"]  # noqa: F822 (defined by __getattr__)


def __getattr__(name: str):
    if name != "SharedTier":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from hicachefs.store.shared.tier import SharedTier

    globals()[name] = SharedTier
    return SharedTier
