"""Pages read into a reader's own memory (a disk page's first read, or no RAM slot to spare)
are bounded by the ``private_reads`` share: a read past it waits for a copy to be let go."""

import threading

import pytest
from store_helpers import KiB, MiB, page_name

from hicachefs.store import PrivateReadsFull
from hicachefs.store.budget import Share
from hicachefs.store.private_reads import PrivateReads
from hicachefs_testing.workload import content


def private_held(store) -> int:
    return store.statistics().ram_budget.shares["private_reads"].held_bytes


def test_disk_reads_past_the_share_wait_for_a_reader_to_let_go(make_store):
    store = make_store(memory=8 * MiB, disk=64 * MiB, max_page_size=256 * KiB)  # private_reads: 1 MiB
    assert store.statistics().ram_budget.shares["private_reads"].limit_bytes == 1 * MiB
    for i in range(48):
        store.put(page_name(i), content(i, 256 * KiB))
    on_disk = [i for i in range(48) if store.info(page_name(i)).tier == "disk"][:5]
    assert len(on_disk) == 5
    readers = [store.open(page_name(i)) for i in on_disk[:4]]  # first reads: private copies
    assert private_held(store) == 1 * MiB
    fifth: list = []
    waiting = threading.Thread(target=lambda: fifth.append(store.open(page_name(on_disk[4]))))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and private_held(store) == 1 * MiB  # waits: the share is full
    readers[0].close()
    waiting.join(5)
    assert not waiting.is_alive()
    assert bytes(fifth[0].view()) == content(on_disk[4], 256 * KiB)
    for i, reader in zip(on_disk[1:4], readers[1:]):
        assert bytes(reader.view()) == content(i, 256 * KiB)
        reader.close()
    fifth[0].close()
    assert private_held(store) == 0


def test_a_read_that_finds_no_room_in_time_is_refused_and_holds_nothing():
    share = Share("private_reads", 1 * MiB)
    reads = PrivateReads(share, wait_s=0.2)
    held, release = reads.buffer(1 * MiB)
    with pytest.raises(PrivateReadsFull):
        reads.buffer(4 * KiB)
    assert share.held == 1 * MiB
    release()
    big, release_big = reads.buffer(3 * MiB)  # one copy is allowed when none is held, whatever its size
    assert len(big) == 3 * MiB and share.held == 3 * MiB
    release_big()
    assert share.held == 0

