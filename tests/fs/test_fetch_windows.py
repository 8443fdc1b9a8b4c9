"""The fetch windows workers answer reads from (``fs/fetch_windows.py``), without FUSE: what a
worker finds in a handle's slot, and which reads it may answer from it."""

from __future__ import annotations

import os

from hicachefs.fs.fetch_windows import FetchWindows, Window
from hicachefs.fs.handle_slots import HandleSlots
from hicachefs.fs.handles import SLOTS, HandleTable, slot_of

SHARED = memoryview(bytearray(os.urandom(1 << 16)))


class Plain:
    cacheable = False

    def release(self) -> None:
        pass


def test_each_open_slotted_handle_has_a_slot_of_its_own_and_finds_only_what_was_put_for_it():
    table, slots = HandleTable(), HandleSlots(64)
    first, second = (table.add(Plain(), slotted=True) << 1 for _ in range(2))
    plain = table.add(Plain()) << 1
    assert slot_of(first >> 1) != slot_of(second >> 1) and slot_of(plain >> 1) is None
    slots.put(first, b"first")
    slots.put(second, b"second")
    slots.put(plain, b"nowhere")
    assert (slots.get(first), slots.get(second), slots.get(plain)) == (b"first", b"second", None)
    table.release(first >> 1)
    slots.clear(first)
    reused = table.add(Plain(), slotted=True) << 1  # the slot is free again, under a new number
    assert slot_of(reused >> 1) == slot_of(first >> 1) and reused != first
    assert slots.get(reused) is None and slots.get(first) is None


def test_past_the_slots_a_handle_has_none():
    table = HandleTable()
    numbers = [table.add(Plain(), slotted=True) for _ in range(SLOTS + 1)]
    assert len({slot_of(n) for n in numbers[:-1]}) == SLOTS and slot_of(numbers[-1]) is None


def test_a_mark_a_worker_leaves_is_seen_once_by_the_owner():
    slots = HandleSlots(64)
    fh = HandleTable().add(Plain(), slotted=True) << 1
    slots.put(fh, b"six")
    assert slots.clear(fh) is False  # nobody used it
    slots.put(fh, b"six")
    slots.mark(fh)
    assert slots.clear(fh) is True and slots.clear(fh) is False
    slots.put(fh, b"again")  # a new window: unmarked
    assert slots.clear(fh) is False


def test_windows_together_pin_at_most_an_eighth_of_the_ram_tier():
    windows, table = FetchWindows(2, 16 << 20), HandleTable()  # 1 MiB ahead each, 2 MiB in all
    first, second, third = (table.add(Plain(), slotted=True) << 1 for _ in range(3))
    unslotted = table.add(Plain()) << 1
    assert windows.ahead_for(first) == 1 << 20 and windows.ahead_for(unslotted) == 0
    windows.show(first, Window([(0, 1 << 20, 0)], False))
    windows.show(second, Window([(0, 768 << 10, 0)], False))
    assert windows.ahead_for(third) == 256 << 10  # what the others leave
    assert windows.ahead_for(second) == 1 << 20  # its own pages are let go before it pins more
    windows.show(second, Window([], True))  # its next answer pinned nothing ahead
    assert windows.ahead_for(third) == 1 << 20
    windows.show(third, Window([(0, 1 << 20, 0)], False))
    assert windows.ahead_for(second) == 0
    windows.hide(first)  # its handle's next request unpins its pages
    assert windows.ahead_for(second) == 1 << 20


def test_a_window_is_read_in_another_process_after_fork():
    windows = FetchWindows(2, 1 << 30)
    fh = HandleTable().add(Plain(), slotted=True) << 1
    windows.show(fh, Window([(0, 4096, 8192)], True))
    pid = os.fork()
    if pid == 0:
        answer = windows.answer(fh, 0, 4096, SHARED)  # marks the slot
        windows.count(2)
        os._exit(0 if answer is not None and bytes(answer[0]) == bytes(SHARED[8192:12288]) else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert windows.answered_alone() == {1: 0, 2: 1}
    assert windows.hide(fh) is True  # the owner learns that the answer began


def test_a_read_is_answered_from_the_window_only_when_it_holds_all_the_read_needs():
    pages = [(0, 1000, 100), (1000, 3000, 5000), (4000, 500, 20000)]
    more, ending = Window(pages, False), Window(pages, True)
    got = more.answer(500, 1000, SHARED)
    assert [bytes(p) for p in got] == [bytes(SHARED[600:1100]), bytes(SHARED[5000:5500])]
    assert more.answer(3900, 600, SHARED) is not None  # ends exactly at the window's end
    assert more.answer(3900, 700, SHARED) is None  # past it, where more pages follow: ask the owner
    short = ending.answer(3900, 700, SHARED)  # past it, where the answer ends: a short read
    assert sum(len(p) for p in short) == 600
    assert more.answer(4500, 10, SHARED) is None  # after the window
    assert Window(pages[1:], True).answer(500, 10, SHARED) is None  # before it
    assert Window([(0, 100, len(SHARED) - 10)], True).answer(0, 100, SHARED) is None  # not in the arena


def test_pages_side_by_side_in_shared_memory_are_answered_as_one_piece():
    window = Window([(0, 1000, 100), (1000, 3000, 1100), (4000, 500, 20000)], True)
    got = window.answer(500, 4000, SHARED)
    assert [bytes(p) for p in got] == [bytes(SHARED[600:4100]), bytes(SHARED[20000:20500])]


def test_a_window_survives_its_encoding_and_stops_at_a_page_outside_shared_memory():
    views = [(0, memoryview(b"x" * 100)), (100, memoryview(b"y" * 50)), (150, memoryview(b"z" * 10))]
    places = {id(views[0][1]): 7, id(views[1][1]): 900}
    window = Window.of(views, True, lambda view: places.get(id(view)))
    assert (window.pages, window.ends) == ([(0, 100, 7), (100, 50, 900)], False)
    again = Window.decode(window.encode())
    assert (again.pages, again.ends) == (window.pages, window.ends)
