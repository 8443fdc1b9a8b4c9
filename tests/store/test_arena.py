from hypothesis import given, settings
from hypothesis import strategies as st

from hicachefs.store.ram.arena import Arena, size_class

KiB, MiB = 1 << 10, 1 << 20


@given(st.integers(0, 64 * MiB))
def test_size_class_holds_the_size_and_wastes_at_most_an_eighth(size):
    slot = size_class(size)
    assert slot >= size and slot % 64 == 0
    assert slot <= max(64, size * 9 // 8 + 64)


def test_common_page_sizes_are_exact():
    for size in (4 * KiB, 64 * KiB, 1 * MiB, 8 * MiB, 64 * MiB):
        assert size_class(size) == size


def test_an_emptied_slab_serves_another_size():
    arena = Arena(4 * MiB, 1 * MiB)
    small = [arena.allocate(4 * KiB) for _ in range(4 * 256)]
    assert None not in small and arena.allocate(1 * MiB) is None
    for offset in small[:256]:  # exactly the first slab
        arena.free(offset)
    big = arena.allocate(1 * MiB)
    assert big == 0 and arena.used_bytes == 4 * MiB


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 300 * KiB)), max_size=200))
def test_slots_never_overlap_nor_exceed_capacity(ops):
    arena = Arena(2 * MiB, 512 * KiB)
    live: dict[int, int] = {}
    for allocate, size in ops:
        if allocate or not live:
            offset = arena.allocate(size)
            if offset is not None:
                live[offset] = size_class(size)
        else:
            offset = next(iter(live))
            del live[offset]
            arena.free(offset)
        spans = sorted(live.items())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert all(a + n <= arena.capacity for a, n in spans)
        assert arena.used_bytes == sum(live.values()) <= arena.capacity


def test_a_batch_reserved_after_churn_still_gets_slots_side_by_side_in_order():
    arena = Arena(4 * MiB, 2 * MiB)  # one slab holds 16 slots of 128 KiB
    older = [arena.allocate(128 * KiB) for _ in range(8)]
    kept = [arena.allocate(128 * KiB) for _ in range(8)]
    for offset in older:  # the older batch is evicted, page by page, oldest first
        arena.free(offset)
    again = [arena.allocate(128 * KiB) for _ in range(8)]
    assert kept[0] == older[-1] + 128 * KiB  # the slab is still in use: its freed slots are reused
    assert again == older  # lowest first: side by side, in the order they were taken


def test_pieces_that_lie_end_to_end_in_the_arena_become_one_view():
    arena = Arena(4 * MiB, 2 * MiB)
    slots = [arena.allocate(128 * KiB) for _ in range(4)]
    views = [arena.view[s : s + 128 * KiB] for s in slots]
    for i, view in enumerate(views):
        view[:] = bytes([i + 1]) * view.nbytes
    pieces = [views[0], views[1][:1000], b"from a lower tier", views[2], views[3][: 64 * KiB]]
    merged = arena.merged(pieces)
    assert b"".join(merged) == b"".join(pieces)
    # views[1] is cut short, so views[2] does not follow it; the bytes piece breaks a run too.
    assert [len(p) for p in merged] == [128 * KiB + 1000, len(b"from a lower tier"), 192 * KiB]
    assert arena.merged([views[1], views[0]]) == [views[1], views[0]]  # out of order: as they were
