"""The SSD tier: one preallocated arena file of a ring of regions of self-describing records,
through a device; it recovers from its index snapshot or a scan, and persists at close."""
