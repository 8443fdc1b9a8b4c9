"""The shared tier: pages on a distributed filesystem that several hosts mount (see ``tier``)."""

from hicachefs.store.shared.tier import SharedTier

__all__ = ["SharedTier"]
