"""A read that finds no room for its own copy of a page (``PrivateReadsFull``) waits on the
event loop, not in a worker thread: 40 such reads waiting in threads held all of them, and every
other user's request that needed one (a promotion, a fetch) waited behind them (found by review)."""

import pytest
import trio

from hicachefs.posix import blocking
from hicachefs.store import PrivateReadsFull


def refused_until(room: list[bool]):
    """A read refused while ``room[0]`` is False, and how many times it ran."""
    ran = []

    def work() -> str:
        ran.append(1)
        if not room[0]:
            raise PrivateReadsFull("no room", room=lambda: room[0])
        return "read"

    return work, ran


def test_a_read_waiting_for_room_holds_no_worker_thread_and_runs_again_once_there_is_room():
    room = [False]
    work, ran = refused_until(room)
    results = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(results, blocking.in_thread(work)))
            await trio.sleep(0.2)
            assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
            assert ran == [1] and results == []
            room[0] = True

    trio.run(main)
    assert results == ["read"] and ran == [1, 1]


def test_a_read_that_finds_no_room_in_time_is_refused(monkeypatch):
    monkeypatch.setattr(blocking, "PRIVATE_ROOM_WAIT_S", 0.2)
    work, ran = refused_until([False])
    with pytest.raises(PrivateReadsFull):
        trio.run(blocking.in_thread, work)
    assert ran == [1]


async def _append(results: list, call) -> None:
    results.append(await call)
