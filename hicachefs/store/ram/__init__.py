"""The RAM tier: the arena new pages are written into (a sealed memfd cut into slabs of slots),
its eviction order, and the pins that keep a slot for its readers. Slab details stay in here;
the engine sees the tier's interface (``tier.TopTier``)."""
