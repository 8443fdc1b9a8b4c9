"""The fetch windows workers answer reads from (``fs/fetch_windows.py``), without FUSE: what a
worker finds in a handle's slot, and which reads it may answer from it."""

from __future__ import annotations

import os

from hicachefs.fs.fetch_windows import FetchWindows, Window
from hicachefs.fs.handle_slots import HandleSlots

SHARED = memoryview(bytearray(os.urandom(1 << 16)))


def test_a_slot_says_what_the_owner_put_for_that_handle_only():
    slots = HandleSlots(8, 64)
    slots.put(6, b"six")
    assert slots.get(6) == b"six"
    assert slots.get(4) is None
    assert slots.get(6 + 2 * 8) is None  # another handle of the same slot
    slots.put(6 + 2 * 8, b"twenty-two")  # takes the slot over
    assert slots.get(6) is None and slots.get(22) == b"twenty-two"
    slots.clear(6)  # not its slot any more: nothing changes
    assert slots.get(22) == b"twenty-two"
    slots.clear(22)
    assert slots.get(22) is None


def test_a_mark_a_worker_leaves_is_seen_once_by_the_owner_even_when_another_handle_takes_the_slot():
    slots = HandleSlots(8, 64)
    slots.put(6, b"six")
    assert slots.clear(6) is False  # nobody used it
    slots.put(6, b"six")
    slots.mark(6)
    assert slots.clear(6) is True and slots.clear(6) is False
    slots.put(6, b"six")
    slots.mark(6)
    assert slots.put(22, b"twenty-two") == 6  # the mark would be lost: said to the owner
    assert slots.put(22, b"again") == 0


def test_a_window_is_read_in_another_process_after_fork():
    windows = FetchWindows(2, 1 << 30)
    windows.show(10, Window([(0, 4096, 8192)], True))
    pid = os.fork()
    if pid == 0:
        answer = windows.answer(10, 0, 4096, SHARED)  # marks the slot
        windows.count(2)
        os._exit(0 if answer is not None and bytes(answer[0]) == bytes(SHARED[8192:12288]) else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert windows.answered_alone() == {1: 0, 2: 1}
    assert windows.hide(10) is True  # the owner learns that the answer began


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


def test_a_window_survives_its_encoding_and_stops_at_a_page_outside_shared_memory():
    views = [(0, memoryview(b"x" * 100)), (100, memoryview(b"y" * 50)), (150, memoryview(b"z" * 10))]
    places = {id(views[0][1]): 7, id(views[1][1]): 900}
    window = Window.of(views, True, lambda view: places.get(id(view)))
    assert (window.pages, window.ends) == ([(0, 100, 7), (100, 50, 900)], False)
    again = Window.decode(window.encode())
    assert (again.pages, again.ends) == (window.pages, window.ends)
